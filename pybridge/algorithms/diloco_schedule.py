"""When (Streaming) DiLoCo syncs which fragment, and how a model is cut into fragments.

torchft's DiLoCo defines the schedule and pybridge follows it: with H = sync_every inner
steps and F fragments, one fragment syncs every H/F steps, round robin (fragment k mod F
for the k-th sync, counted from 0), so each fragment syncs once every H steps. The k-th
sync starts `delay` (tau) steps before it is applied: its pseudo-gradient is taken after
inner step (k+1) H/F - tau and the result is applied after inner step (k+1) H/F, the
inner steps in between running while it travels. Steps count the calls of DiLoCo.step()
from 1. F = 1 and tau = 0 is plain DiLoCo: every rank syncs the whole model after steps
H, 2H, ...
"""

from typing import NamedTuple

from ..base.checks import integer
from ..errors import InvalidArgument


class Sync(NamedTuple):
    number: int    # k: the syncs before it
    fragment: int  # k mod F
    launch: int    # the step after which its pseudo-gradient is taken
    apply: int     # the step after which its result is applied (launch + delay)


class Schedule:
    def __init__(self, sync_every, fragments=1, delay=0):
        self.sync_every = integer("sync_every", sync_every, low=1)
        self.fragments = integer("fragments", fragments, low=1)
        self.delay = integer("delay", delay, low=0)
        if self.sync_every % self.fragments:
            raise InvalidArgument(f"sync_every {self.sync_every} is not a multiple of the {self.fragments} "
                                  "fragments (each fragment syncs once every sync_every steps, one every "
                                  "sync_every / fragments)")
        self.interval = self.sync_every // self.fragments
        if self.delay >= self.interval:
            raise InvalidArgument(f"delay {self.delay} must be below sync_every / fragments = {self.interval}: "
                                  "a sync must be applied before the next one starts")

    def sync(self, number):
        """The `number`-th sync (from 0)."""
        apply = (number + 1) * self.interval
        return Sync(number, number % self.fragments, apply - self.delay, apply)

    def launched_after(self, step):
        """The sync whose pseudo-gradient is taken after inner step `step`, or None."""
        if (step + self.delay) % self.interval:
            return None
        number = (step + self.delay) // self.interval - 1
        return self.sync(number) if number >= 0 else None

    def applied_after(self, step):
        """The sync applied after inner step `step`, or None."""
        if step <= 0 or step % self.interval:
            return None
        return self.sync(step // self.interval - 1)

    def applied_by(self, step):
        """How many syncs are applied once inner step `step` is done."""
        return max(step, 0) // self.interval

    def syncs(self, steps):
        """Every sync applied within the first `steps` inner steps, in order."""
        return [self.sync(k) for k in range(self.applied_by(steps))]


def split(numels, fragments):
    """Tensor indices of each of `fragments` fragments: consecutive runs of tensors, cut
    where the running count of elements crosses k/F of the total, each fragment holding at
    least one tensor."""
    fragments = integer("fragments", fragments, low=1)
    count = len(numels)
    if fragments > count:
        raise InvalidArgument(f"{fragments} fragments of {count} tensors: each fragment needs a tensor")
    total = sum(numels)
    out, start, running = [], 0, 0
    for f in range(fragments - 1):
        end = start + 1  # at least one tensor
        running += numels[start]
        goal = total * (f + 1) / fragments
        # take more while under the goal and enough tensors stay for the fragments after
        while end < count - (fragments - 1 - f) and running + numels[end] / 2 <= goal:
            running += numels[end]
            end += 1
        out.append(list(range(start, end)))
        start = end
    out.append(list(range(start, count)))
    return out


def check_partition(fragments, count):
    """Lists of tensor indices given by hand: every tensor in exactly one non-empty fragment."""
    seen = {}
    out = []
    for f, members in enumerate(fragments):
        members = [integer(f"fragment {f}'s tensor index", i, low=0, high=count - 1) for i in members]
        if not members:
            raise InvalidArgument(f"fragment {f} is empty")
        for i in members:
            if i in seen:
                raise InvalidArgument(f"tensor {i} is in fragments {seen[i]} and {f}")
            seen[i] = f
        out.append(members)
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        raise InvalidArgument(f"tensors {missing} are in no fragment")
    return out


__all__ = ["Schedule", "Sync", "split", "check_partition"]
