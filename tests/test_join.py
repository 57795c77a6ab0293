"""Uneven inputs (Join) against torch's DDP under torch's Join context on the same data (2 and
3 ranks; 5, 8 and 11 batches per rank; both divisors): pybridge's DDP wrapper under the same
context (with buffers, unused parameters, throw_on_early_termination), and a program driving
the C ABI's reducer with PB_REDUCER_JOIN and pb_reducer_join (cffi, as a C program would);
then the dynamic loader training under Join with every record read once per epoch. One
launch per world size covers every case, bounded by run_ranks' timeout, so a hang fails.
(Go: go/join_test.go.)"""

import os
import time

import pytest
import torch
from torch.distributed.algorithms.join import Join

from capi_loader import LIB_PATH, init_world, last_error, load
from ranks import run_ranks
from test_capi_reducer import options as reducer_options

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")

# (batches per rank, divide_by_initial_world_size, find_unused_parameters, through ddp.join(),
#  every other batch accumulated under no_sync)
CASES = {
    2: [((5, 8), True, False, True, False), ((11, 5), False, False, False, True),
        ((8, 11), True, True, False, False)],
    3: [((5, 8, 11), True, False, False, False), ((11, 5, 8), False, True, True, False),
        ((8, 11, 5), False, False, False, True)],
}


class Net(torch.nn.Module):
    """Tiny, with a buffer (BatchNorm's running stats, broadcast as torch DDP does) and, with
    unused=True, a layer that gets no gradient on odd ranks."""

    def __init__(self, unused=False, bn=True):
        super().__init__()
        self.a = torch.nn.Linear(4, 6)
        self.bn = torch.nn.BatchNorm1d(6) if bn else torch.nn.Identity()
        self.b = torch.nn.Linear(6, 3)
        self.extra = torch.nn.Linear(6, 3) if unused else None

    def forward(self, x):
        h = torch.relu(self.bn(self.a(x)))
        out = self.b(h)
        if self.extra is not None and torch.distributed.get_rank() % 2 == 0:
            out = out + self.extra(h)
        return out


def batch(case, rank, k):
    g = torch.Generator().manual_seed(1000 * case + 100 * rank + k)
    return torch.randn(4, 4, generator=g), torch.randn(4, 3, generator=g)


def train(wrap, case, rank, counts, divide, unused, method, accumulate):
    torch.manual_seed(case)
    # Under no_sync torch broadcasts buffers in the forward after a synchronized one, the
    # wrapper in the synchronized forward itself: without buffers, the rest is compared.
    model = wrap(Net(unused, bn=not accumulate))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ctx = (model.join(divide_by_initial_world_size=divide) if method
           else Join([model], divide_by_initial_world_size=divide))
    with ctx:
        for k in range(counts[rank]):
            x, y = batch(case, rank, k)
            if accumulate and k % 2 == 0:  # joined ranks must not shadow these
                with model.no_sync():
                    torch.nn.functional.mse_loss(model(x), y).backward()
                continue
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    state = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    return model, state


# The C ABI's cases: (batches per rank, divide_by_initial_world_size).
C_CASES = {2: [((5, 8), True), ((11, 5), False)], 3: [((5, 8, 11), True), ((8, 11, 5), False)]}


def c_training(ffi, lib, g, rank, world):
    """A C program's loop: gradients computed locally, written into the reducer's views,
    marked, reduced; at the end of its batches the rank joins, then takes the root's
    parameters. Compared with torch DDP + Join on the same data."""
    import numpy as np

    def ok(rc):
        assert rc == 0, last_error(ffi, lib)

    def sgd(params):
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)

    out = []
    for case, (counts, divide) in enumerate(C_CASES[world], start=10):
        torch.manual_seed(case)
        ref = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 3))
        opt = sgd(ref.parameters())
        with ref.join(divide_by_initial_world_size=divide):
            for k in range(counts[rank]):
                x, y = batch(case, rank, k)
                opt.zero_grad()
                torch.nn.functional.mse_loss(ref(x), y).backward()
                opt.step()

        torch.manual_seed(case)
        model = torch.nn.Linear(4, 3)
        params = list(model.parameters())
        opt = sgd(params)
        flags = lib.PB_REDUCER_JOIN | (0 if divide else lib.PB_REDUCER_JOIN_DIVIDE_BY_ACTIVE)
        o = reducer_options(ffi, lib, bucket_cap_mb=1e-5, flags=flags)  # one bucket per gradient
        rp = ffi.new("pb_reducer **")
        ok(lib.pb_reducer_create(g, len(params), ffi.new("int64_t[]", [p.numel() for p in params]),
                                 ffi.new("int32_t[]", [lib.PB_FLOAT32] * len(params)), o, rp))
        r, d = rp[0], ffi.new("pb_tensor *")

        def view(i):
            ok(lib.pb_reducer_grad(r, i, d))
            return torch.from_numpy(np.frombuffer(ffi.buffer(d.data, 4 * d.count), dtype=np.float32))

        for k in range(counts[rank]):
            x, y = batch(case, rank, k)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            for i in reversed(range(len(params))):
                view(i).copy_(params[i].grad.reshape(-1))
                ok(lib.pb_reducer_mark_ready(r, i))
            ok(lib.pb_reducer_wait(r, 20.0))
            for i, p in enumerate(params):
                p.grad.copy_(view(i).view(p.shape))
            opt.step()
        root, shadowed = ffi.new("int32_t *"), ffi.new("int64_t *")
        ok(lib.pb_reducer_join(r, root, shadowed))
        assert shadowed[0] == max(counts) - counts[rank]
        descs = ffi.new("pb_tensor[]", len(params))
        for i, p in enumerate(params):
            descs[i].data = ffi.cast("void *", p.data_ptr())
            descs[i].count, descs[i].dtype, descs[i].device = p.numel(), lib.PB_FLOAT32, lib.PB_CPU
        ok(lib.pb_broadcast_params(g, len(params), descs, root[0]))
        ok(lib.pb_reducer_close(r))
        for p, q in zip(params, ref.module.parameters()):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-6, msg=lambda m: f"C case {case}: {m}")
        out.append(case)
    return out


def join_ranks(rank, world, data_paths):
    import torch.distributed as dist

    import pybridge
    from pybridge import recordio

    ffi, lib = load()  # the C ABI in this process: pb_init is pybridge.init here
    g = init_world(ffi, lib)
    c_cases = c_training(ffi, lib, g, rank, world)
    caps = {"bucket_cap_mb": 1e-4}  # several buckets, so the shadows keep bucket order
    out = []
    for case, (counts, divide, unused, method, accumulate) in enumerate(CASES[world]):
        torch_ddp = lambda m: torch.nn.parallel.DistributedDataParallel(  # noqa: E731
            m, find_unused_parameters=unused, **caps)
        pb_ddp = lambda m: pybridge.DistributedDataParallel(m, find_unused_parameters=unused, **caps)  # noqa: E731
        _, want = train(torch_ddp, case, rank, counts, divide, unused, method, accumulate)
        model, got = train(pb_ddp, case, rank, counts, divide, unused, method, accumulate)
        for k in want:
            torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6, msg=lambda m, k=k: f"case {case} {k}: {m}")
        model.close()
        # Every rank ends with the same model.
        flat = torch.cat([v.reshape(-1).float() for v in got.values()])
        every = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(every, flat)
        assert all(torch.equal(every[0], e) for e in every), f"case {case}: ranks differ after join"
        out.append(case)

    # throw_on_early_termination: every rank raises once the first runs out, and the group is
    # still in step afterwards.
    model = pybridge.DistributedDataParallel(torch.nn.Linear(2, 1))
    with pytest.raises(RuntimeError, match="exhausted|Throwing"):
        with model.join(throw_on_early_termination=True):
            for _ in range(3 + rank):
                model(torch.ones(1, 2)).sum().backward()
    t = torch.ones(1)
    pybridge.all_reduce(t)
    assert t.item() == world
    model.close()

    # A subgroup pybridge built is unknown to torch's Join context: refused, saying so.
    sub = pybridge.new_group([0, 1])
    if sub is not None:
        model = pybridge.DistributedDataParallel(torch.nn.Linear(2, 1), group=sub)
        with pytest.raises(pybridge.InvalidArgument, match="Join needs a group torch.distributed knows"):
            model.join()
        model.close()

    # The dynamic partition under Join (rank 0 slowed): every record is read exactly once
    # per epoch, whoever claims the last tasks.
    model = pybridge.DistributedDataParallel(torch.nn.Linear(1, 1))
    loader = recordio.Loader(data_paths, 3, partition="dynamic", task_records=3, prefetch=0)
    seen, batches = [], []
    for epoch in range(2):
        loader.set_epoch(epoch)
        n = 0
        with model.join():
            for b in loader:
                if rank == 0:
                    time.sleep(0.005)
                recs = b.tolist()
                seen += [(epoch, int(r)) for r in recs]
                x = torch.tensor([[float(r)] for r in recs])
                model(x).sum().backward()
                n += 1
        batches.append(n)
    loader.close()
    model.close()
    assert lib.pb_finalize(g) == 0
    return out, seen, batches, c_cases


@pytest.fixture(scope="module")
def data_paths(tmp_path_factory):
    from pybridge import recordio
    d = tmp_path_factory.mktemp("join")
    paths = []
    for f in range(2):
        path = str(d / f"part-{f}.recordio")
        recordio.write_file(path, [b"%d" % (f * 100 + i) for i in range(60)], "none", 64)
        paths.append(path)
    return paths


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_join_matches_torch(world, data_paths):
    results = run_ranks(join_ranks, world, data_paths, timeout=120.0)
    for rank in range(world):
        assert results[rank][0] == list(range(len(CASES[world])))
        assert results[rank][3] == [10, 11]
    for epoch in range(2):
        got = sorted(r for rank in range(world) for e, r in results[rank][1] if e == epoch)
        assert got == sorted(f * 100 + i for f in range(2) for i in range(60)), f"epoch {epoch}"
    # Ranks step in lockstep, so the dynamic partition's counts differ only by the last
    # tasks of an epoch: the explicit cases above are what makes them uneven for sure.
    print("batches per rank and epoch:", [results[rank][2] for rank in range(world)])
