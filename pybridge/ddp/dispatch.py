"""Hook dispatch: a reducer's buckets, from readiness through the comm hook to the reduced
values.

A bucket goes to the hook once all its gradients are marked and every earlier bucket has
gone: buckets go out strictly in order 0..n-1, whatever order gradients arrive in, which
keeps the collectives in the same sequence on every rank. Waiting takes each hook's value
and copies it into the bucket when the hook returned other memory (a decompressed wire).

`Hook` is the reducer's hook and the state it owns; `Iteration` is one iteration's
readiness and launches (a new one per iteration); `shadow` is a joined rank's iteration,
the same launches with zeros (uneven inputs, join.py).
"""

import time

import torch

from ..algorithms import comm_hooks, contract
from ..comm import watchdog
from ..errors import InvalidState, Timeout, classify
from ..observe import state as _obs
from .layout import member_views


class Hook:
    """The reducer's comm hook: `fn(state, bucket) -> Future`, its `state` (owned: a state
    replaced or released is closed if it has close(), such as a GossipState's thread and
    groups), `spec` (the built-in hook chosen by settings, built again for a new group, or
    None), `identity` (what the ranks compare), and how it is launched: `prescales` (a
    summing built-in: the reducer folds avg's 1/size into the gradient copy) and `eager`
    (issues all its collectives before returning: the next bucket need not wait for it),
    `name` (the function's, for the trace) and, for a hook that declares one
    (comm_hooks.declare_prepared), each bucket's prepared launch (launches())."""

    __slots__ = ("spec", "state", "fn", "identity", "prescales", "eager", "name", "prepare", "_launches_for",
                 "_launches")

    def __init__(self, spec=None, state=None, fn=None):
        self.spec, self.state, self.fn = spec, state, fn
        self.prescales = self.eager = False
        self.identity = None
        self.name = "hook"
        self.prepare = None
        self._forget()

    def plan(self):
        """Set `identity` to the hook's as build() will make it, for the ranks to compare
        first: building a built-in hook may itself be a collective (gossip's groups)."""
        self.identity = self.spec.identity() if self.spec is not None else comm_hooks.identity(self.state, self.fn)

    def build(self, group):
        """Make the hook for `group`: a built-in one from its spec, a callable as given."""
        if self.spec is not None:
            self.use(*self.spec.build(group), spec=self.spec)
        else:
            self.use(self.state, self.fn)

    def use(self, state, fn, spec=None):
        """Communicate with fn(state, bucket) from now on; the previous state is closed."""
        old = self.state
        self.spec, self.state, self.fn = spec, state, fn
        self.identity = comm_hooks.identity(state, fn)
        if old is not None and old is not state:
            close_state(old)
        self.prescales = comm_hooks.prescales(fn)
        self.eager = comm_hooks.is_eager(fn)
        self.name = getattr(fn, "__name__", "hook")
        self.prepare = comm_hooks.prepared(fn)
        self._forget()

    def launches(self, layout):
        """The prepared launch of each of `layout`'s buckets, made by launch() on first use
        and kept while the hook and the layout stay; None when the hook declares none."""
        if self._launches_for is not layout:
            self._launches_for = layout
            self._launches = None if self.prepare is None else [None] * len(layout.buckets)
        return self._launches

    def launch(self, bucket):
        """Bucket's prepared launch, made now: prepare(state, buffer) -> launch(scale)."""
        run = self._launches[bucket.index] = self.prepare(self.state, bucket.flat)
        return run

    def _forget(self):
        self._launches_for = self._launches = None  # also lets a closed reducer's buckets go

    def detach(self):
        """The state, no longer the hook's: the reducer is closing, and closes it (close_state)
        outside its lock."""
        state, self.state = self.state, None
        self._forget()
        return state

    @property
    def step(self):
        """The state's step counter a checkpoint keeps (comm_hooks.hook_step)."""
        return comm_hooks.hook_step(self.state)

    @step.setter
    def step(self, value):
        comm_hooks.set_hook_step(self.state, value)


def close_state(state):
    """Close a hook state that owns resources (GossipState: a thread and groups)."""
    if isinstance(state, contract.Closing) and callable(state.close):
        state.close()


def exchanged(bucket, hook, world):
    """Whether `bucket` goes through the hook: not when it is empty, nor for a summing
    built-in on one rank (nothing to exchange); other hooks run on one rank too, as in torch."""
    return bucket.flat.numel() and not (world == 1 and hook.prescales)


def grad_bucket(bucket, flat, views, params, last, scale=None):
    """The hook's view of a bucket (comm_hooks.GradBucket) over `flat` and `views`."""
    members = None if params is None else [params[i] for i in bucket.members]
    return comm_hooks.GradBucket(bucket.index, flat, views, members, bucket.index == last, scale)


def await_value(fut, deadline, bucket):
    """The value of `bucket`'s hook's future (its first element if a list), within `deadline`
    (time.monotonic(), or None for no bound). torch futures have no timed wait: poll."""
    if deadline is not None and not fut.done():
        pause = 50e-6
        while not fut.done():
            if time.monotonic() >= deadline:
                raise Timeout(f"bucket {bucket.index} did not finish in time")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
    value = fut.wait()
    return value[0] if isinstance(value, (list, tuple)) else value


def bucket_error(exc, bucket, group=None):
    """A pybridge error that names the bucket whose communication failed (and, given the
    group, the ranks that died or are late: watchdog.py)."""
    what = f"bucket {bucket.index} ({len(bucket.members)} gradients)"
    if group is not None:
        return watchdog.explain_latest(group, exc, what)
    err = classify(exc)
    err.args = (f"{what}: {err}",)
    return err


class Iteration:
    """One iteration of a layout's buckets: which gradients are ready, which buckets are
    still missing some (`pending`), the next bucket to launch (`next`) and the launched
    buckets' futures (`works`). `scale`: the averaging factor folded into gradient copies
    (None: the hook averages itself); `order`: the order gradients became ready in, kept
    for the one rebuild (None once it is done). `begun` and `count_work` are the reducer's
    start of an iteration (join's count, reducer._begin)."""

    __slots__ = ("layout", "buckets", "views", "bucket_of", "last", "hook", "group", "world", "params",
                 "ready", "pending", "scaled", "nscaled", "next", "works", "begun", "count_work",
                 "scale", "order", "ending", "marked")

    def __init__(self, layout, hook, group, params, scale, record_order):
        self.layout = layout
        self.buckets, self.views, self.bucket_of, self.last = layout.buckets, layout.views, layout.bucket_of, layout.last
        self.hook, self.params = hook, params
        self.group, self.world = group, group.size
        n = len(self.views)
        self.ready = bytearray(n)
        self.pending = list(layout.sizes)
        self.scaled = bytearray(n)  # already divided by copy_in
        self.nscaled = [0] * len(self.buckets)
        self.next = 0  # next bucket to launch; buckets go out strictly in order
        self.works = []
        self.begun = False
        self.count_work = None  # join's count of this iteration, still in flight
        self.scale = scale
        self.order = [] if record_order else None
        self.ending = False  # wait() or poll() has launched what was left (reducer._end_marks)
        self.marked = 0  # gradients marked so far

    def drop(self, group):
        """Forget the launches in flight and go on over `group` (the reducer's rebind)."""
        self.group, self.world = group, group.size
        self.works, self.count_work = [], None

    def missing(self):
        """Indices not yet marked ready."""
        if self.marked == len(self.ready):
            return []
        return [i for i, r in enumerate(self.ready) if not r]

    def copy_in(self, i, grad):
        """Gradient i's view := grad, with the averaging division folded into the copy."""
        view = self.views[i]
        src = grad if grad.shape == view.shape else grad.reshape(view.shape)
        if src.requires_grad:  # backward(create_graph=True): the bucket takes the value, not the graph
            src = src.detach()
        if self.scale is None:
            view.copy_(src)
        else:
            torch.mul(src, self.scale, out=view)
            self.scaled[i] = 1
            self.nscaled[self.bucket_of[i]] += 1

    def mark(self, i):
        """Gradient i is ready (the caller checked that it was not yet): launch what can go."""
        self.ready[i] = 1
        self.marked += 1
        if self.order is not None:
            self.order.append(i)
        b = self.bucket_of[i]
        self.pending[b] -= 1
        rec = _obs.REC
        if rec is not None and (self.marked == 1 or self.pending[b] == 0):
            # backward's first gradient and each bucket's last: the backward span's ends and
            # a look at what finished, at a cost per bucket rather than per gradient
            rec.on_grad_ready()
        if self.pending[b] == 0 and b == self.next:
            self.launch_ready()

    def count_unmarked(self, missing):
        """The unmarked gradients count with what their views hold (allow_unused): launch
        every bucket still to go, in order."""
        for i in missing:
            self.pending[self.bucket_of[i]] -= 1
        self.launch_ready()

    def launch_ready(self):
        pending, buckets, hook = self.pending, self.buckets, self.hook
        launches = None
        while self.next < len(buckets) and pending[self.next] == 0:
            bucket = buckets[self.next]
            self.next += 1
            if not exchanged(bucket, hook, self.world):
                continue
            # Pre-divide (as torch DDP does): keeps fp16 sums in range, and the result needs
            # no extra pass after the wait. Gradients that came through copy_in already are.
            scale = self.scale
            nscaled = self.nscaled[bucket.index]
            if scale is not None and 0 < nscaled < len(bucket.members):
                for i in bucket.members:
                    if not self.scaled[i]:
                        self.views[i].mul_(scale)
                scale = None
            elif nscaled:
                scale = None
            prev = self.works[-1][1] if self.works and not hook.eager else None
            if prev is None or prev.done():
                if launches is None:
                    launches = hook.launches(self.layout)
                if launches is not None:  # a prepared launch (comm_hooks.declare_prepared): no bucket object
                    try:
                        fut = (launches[bucket.index] or hook.launch(bucket))(scale)
                    except Exception as exc:  # noqa: BLE001
                        raise bucket_error(exc, bucket) from exc
                    self._launched(bucket, fut)
                    continue
            views = [self.views[i] for i in bucket.members]
            gb = grad_bucket(bucket, bucket.flat, views, self.params, self.last, scale)
            if prev is not None and not prev.done():
                # A hook may issue further collectives from its future's callbacks (PowerSGD
                # does, on the backend's thread). Started while those are still to come, the
                # next bucket's collectives could go out in another order on another rank
                # (seen: gloo aborting on a size mismatch, under torch DDP as well). So the
                # next hook starts when the previous future is done, from its callback:
                # the same order everywhere, and backward is not held up. Hooks declared
                # eager (comm_hooks.declare_eager) start at once.
                fut = self._after(prev, bucket, gb)
            else:
                try:
                    fut = hook.fn(hook.state, gb)
                except Exception as exc:  # noqa: BLE001
                    raise bucket_error(exc, bucket) from exc
            self._launched(bucket, fut)

    def _launched(self, bucket, fut):
        self.works.append((bucket, fut))
        rec = _obs.REC
        if rec is not None:
            rec.on_bucket_launched(bucket.index, bucket.nbytes, self.hook.name, fut)

    def _after(self, prev, bucket, gb):
        """A future for `bucket`'s hook, started once `prev` is done."""
        fut = torch.futures.Future()
        hook = self.hook

        def finish(inner):
            try:
                fut.set_result(inner.value())
            except Exception as exc:  # noqa: BLE001 - raised by wait(), naming the bucket
                fut.set_exception(exc)

        def start(_):
            try:
                hook.fn(hook.state, gb).add_done_callback(finish)
            except Exception as exc:  # noqa: BLE001
                fut.set_exception(bucket_error(exc, bucket))

        prev.add_done_callback(start)
        return fut

    def finish(self, deadline):
        """Wait for every launched bucket (within `deadline`, time.monotonic() or None) and
        leave each hook's value in its bucket."""
        works, self.works = self.works, []
        rec = _obs.REC
        try:
            for bucket, fut in works:
                value = await_value(fut, deadline, bucket)
                if rec is not None:
                    rec.on_bucket_value(bucket.index)
                flat = bucket.flat
                if value is not flat and value.data_ptr() != flat.data_ptr():
                    flat.copy_(value)  # e.g. decompress in place
        except Exception as exc:  # noqa: BLE001
            raise bucket_error(exc, bucket, self.group) from exc
        if rec is not None:
            rec.on_buckets_finished()

    def settled(self, deadline):
        """Whether join's count and every launched bucket have finished, looking until
        `deadline` (time.monotonic()); the buckets' values (or errors) stay for finish(),
        a failed count raises here."""
        pause = 50e-6
        while True:
            if (self.count_work is None or self.count_work.test()) and all(fut.done() for _, fut in self.works):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(pause, left))
            pause = min(pause * 2, 1e-3)

    def drain(self, limit=10.0):
        """Wait (bounded) for the buckets already launched, so that no allreduce is still
        writing into the buffers when the caller writes the next iteration's gradients.
        Ranks that made the same mistake launched the same buckets, so this is quick."""
        works, self.works = self.works, []
        deadline = time.monotonic() + min(limit, self.group.timeout or limit)
        try:
            if self.count_work is not None:
                self.count_work.wait(max(deadline - time.monotonic(), 1e-3))
            for bucket, fut in works:
                await_value(fut, deadline, bucket)
        except Exception:  # noqa: BLE001 - reported as part of the caller's error
            return False
        return True


def shadow(layout, specs, hook, params, group):
    """A joined rank's part of one iteration (join.py): the buckets the ranks still training
    send, filled with zeros, through the same hook in bucket order, each hook started when
    the previous one is done unless the hook is eager (as Iteration launches them); then
    waited. This rank's own gradient views are left as they are."""
    futs = []
    for bucket in layout.buckets:
        if not exchanged(bucket, hook, group.size):
            continue
        flat = torch.zeros_like(bucket.flat)
        gb = grad_bucket(bucket, flat, member_views(flat, bucket.members, specs), params, layout.last)
        try:
            fut = hook.fn(hook.state, gb)
            if not hook.eager:
                await_value(fut, None, bucket)
        except Exception as exc:  # noqa: BLE001
            raise bucket_error(exc, bucket, group) from exc
        futs.append((bucket, fut))
    for bucket, fut in futs:
        try:
            await_value(fut, None, bucket)
        except Exception as exc:  # noqa: BLE001
            raise bucket_error(exc, bucket, group) from exc


def unused_error(rank, missing, names, drained):
    """torch DDP's most common error ("Expected to have finished reduction in the prior
    iteration", pytorch #57776), said at the end of the iteration that caused it: which
    gradients, by index (what C and Go pass) and by name, on which rank."""
    shown = 20
    indices = " ".join(map(str, missing[:shown]))
    more = f" and {len(missing) - shown} more" if len(missing) > shown else ""
    by_name = ""
    if names:
        by_name = f"; by name: {', '.join(names[i] for i in missing[:shown])}{more}"
    return InvalidState(
        f"rank {rank}: {len(missing)} gradient(s) were not marked ready in this iteration, "
        f"so the reduction cannot finish (torch DDP reports this at the next iteration as \"Expected "
        f"to have finished reduction in the prior iteration before starting a new one\"). Parameter "
        f"indices which did not receive grad for rank {rank}: {indices}{more}{by_name}. "
        "Mark every gradient each iteration, or create the reducer with allow_unused=True "
        "(find_unused_parameters=True in the DDP wrapper) so that they count as zero, and make sure "
        "every forward output takes part in the loss"
        + ("" if drained else ". The buckets already sent did not complete: other ranks marked "
           "different gradients, so the process group is out of step"))


__all__ = ["Hook", "Iteration", "close_state", "exchanged", "grad_bucket", "await_value",
           "bucket_error", "shadow", "unused_error"]
