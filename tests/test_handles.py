"""libtorch tensors by handle through the C ABI (PB_TORCH_TENSOR, pb_reducer_attach), on
real ranks, in-process through cffi: the handles are `at::Tensor`s as a C++ program holds
them (pybridge.base.at_tensor.handle_of), the model is torch's, and the reference is the
real torch DistributedDataParallel on the same ranks. tests/test_handles_cpp.py drives the
same API from a C++ libtorch program, whose backward runs without the interpreter's lock."""

import os
import time

import pytest

from capi_loader import LIB_PATH, init_world, last_error, load
from ranks import run_ranks

pytestmark = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")

STEPS = 20
DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]


class Handles:
    """pb_tensor descriptors naming tensors by handle; keeps the at::Tensor blocks alive."""

    def __init__(self, ffi, lib):
        self.ffi, self.lib, self._blocks = ffi, lib, []

    def __call__(self, t):
        from pybridge.base.at_tensor import handle_of
        block, address = handle_of(t)
        self._blocks.append((block, t))
        d = self.ffi.new("pb_tensor *")
        d.data = self.ffi.cast("void *", address)
        d.dtype = self.lib.PB_TORCH_TENSOR
        return d

    def array(self, ts):
        arr = self.ffi.new("pb_tensor[]", len(ts))
        for i, t in enumerate(ts):
            arr[i] = self(t)[0]
        return arr



# ---- collectives ---------------------------------------------------------------------------

def collectives_by_handle(rank, world, device="cpu"):
    import torch
    torch.set_default_device(device)
    ffi, lib = load()
    g = init_world(ffi, lib, device=device)
    h = Handles(ffi, lib)
    for name in DTYPES:  # every dtype the backend reduces, read from the tensor: exact
        dt = getattr(torch, name)
        x = (torch.arange(7) % 3 + rank).to(dt)
        assert lib.pb_all_reduce(g, h(x), lib.PB_SUM) == 0, (name, last_error(ffi, lib))
        want = sum((torch.arange(7) % 3 + r) for r in range(world)).to(dt)
        assert x.dtype == dt and torch.equal(x, want), (name, x, want)
    y = torch.rand(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(rank)).to(device)
    sent = torch.rand(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(world - 1)).to(device)
    assert lib.pb_broadcast(g, h(y), world - 1) == 0, last_error(ffi, lib)
    assert torch.equal(y, sent)  # bit-exact
    # A 2-D tensor that requires grad (a parameter): its storage is written, autograd records nothing.
    w = torch.full((3, 4), float(rank), requires_grad=True)
    assert lib.pb_all_reduce(g, h(w), lib.PB_AVG) == 0, last_error(ffi, lib)
    assert w.grad_fn is None and torch.equal(w.detach(), torch.full((3, 4), (world - 1) / 2))
    # Async: the library holds its own reference, so the program may drop its tensor at once.
    z = torch.ones(4096) * (rank + 1)
    uses = torch._C._storage_Use_Count  # references to z's memory
    before = uses(z.untyped_storage()._cdata)
    wp = ffi.new("pb_work **")
    assert lib.pb_all_reduce_tensor_async(g, h(z), lib.PB_SUM, wp) == 0, last_error(ffi, lib)
    assert uses(z.untyped_storage()._cdata) == before + 1  # the library's own reference
    assert lib.pb_work_wait(wp[0], 30.0) == 0, last_error(ffi, lib)
    assert torch.equal(z, torch.full((4096,), float(sum(range(1, world + 1)))))
    assert lib.pb_work_close(wp[0]) == 0
    for _ in range(500):  # released with the work (gloo's thread lets go of it just after)
        if uses(z.untyped_storage()._cdata) == before:
            break
        time.sleep(0.01)
    assert uses(z.untyped_storage()._cdata) == before
    # all_gather, reduce_scatter and point-to-point messages by handle.
    mine = torch.full((3,), float(rank))
    everyone = torch.zeros(3 * world)
    assert lib.pb_all_gather(g, h(mine), h(everyone)) == 0, last_error(ffi, lib)
    assert everyone.tolist() == [float(r) for r in range(world) for _ in range(3)]
    part = torch.zeros(2, dtype=torch.int64)
    assert lib.pb_reduce_scatter(g, h(torch.arange(2 * world)), h(part), lib.PB_SUM) == 0, last_error(ffi, lib)
    assert part.tolist() == [world * (2 * rank), world * (2 * rank + 1)]
    if rank == 0:
        assert lib.pb_send(g, h(torch.tensor([7.5, 8.5], dtype=torch.float64)), 1, 4) == 0, last_error(ffi, lib)
    elif rank == 1:
        got = torch.zeros(2, dtype=torch.float64)
        assert lib.pb_recv(g, h(got), 0, 4) == 0, last_error(ffi, lib)
        assert got.tolist() == [7.5, 8.5]
    # BroadcastParams over handles of mixed dtypes.
    ps = [torch.full((5,), float(rank)), torch.full((2, 2), rank, dtype=torch.int64)]
    assert lib.pb_broadcast_params(g, 2, h.array(ps), 0) == 0, last_error(ffi, lib)
    assert all(torch.equal(p, torch.zeros_like(p)) for p in ps)
    # Refused by name.
    refused = {}
    nc = torch.zeros(4, 6)[:, ::2]
    for what, d in [("null", ffi.new("pb_tensor *", {"dtype": lib.PB_TORCH_TENSOR})),
                    ("noncontiguous", h(nc)), ("complex", h(torch.zeros(3, dtype=torch.complex64))),
                    ("bool", h(torch.zeros(3, dtype=torch.bool))),
                    ("sparse", h(torch.zeros(3, 3).to_sparse())),
                    ("meta", h(torch.zeros(3, device="meta")))]:
        rc = lib.pb_all_reduce(g, d, lib.PB_SUM)
        refused[what] = (rc, last_error(ffi, lib))
    assert lib.pb_finalize(g) == 0
    return refused


@pytest.mark.parametrize("world", [2, 3])
def test_collectives_by_handle(world):
    refused = run_ranks(collectives_by_handle, world, timeout=90)[0]
    from pybridge import abi
    assert all(rc == abi.PB_ERR_INVALID_ARGUMENT for rc, _ in refused.values()), {k: v for k, v in refused.items()
                                                                                   if v[0] != abi.PB_ERR_INVALID_ARGUMENT}
    assert "pb_all_reduce: tensor: the at::Tensor* handle is NULL" in refused["null"][1]
    assert "tensor is not contiguous (sizes (4, 3), strides (6, 2))" in refused["noncontiguous"][1]
    assert "tensor has dtype torch.complex64, which the collectives do not reduce" in refused["complex"][1]
    assert "torch.bool" in refused["bool"][1]
    assert "tensor is a sparse tensor" in refused["sparse"][1]
    assert "tensor is on meta; collectives take host (cpu) or CUDA tensors" in refused["meta"][1]


# ---- the reducer attached to a model's parameters ------------------------------------------

HOOKS = {  # pybridge's hook code -> torch's hook and state (None: compare with sequential training)
    "allreduce": "none", "fp16": "fp16", "bf16": "bf16", "powersgd": "powersgd",
    "hierarchical": None, "gossip": None,
}


def _model(seed=0):
    import torch
    torch.manual_seed(seed)
    with torch.device("cpu"):  # the same numbers on every device: drawn on the host, then moved
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    return model.to(torch.get_default_device())


def _data(world):
    import torch
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, 6 * world, 8, generator=gen, device="cpu")
    return x, torch.randn(STEPS, 6 * world, 4, generator=gen, device="cpu")


def zero_grad_as_libtorch(params, step):
    """libtorch's Optimizer::zero_grad (gotch's too): detach_() each .grad, then drop it
    (set_to_none, the default: even steps) or zero it in place (odd steps)."""
    for p in params:
        if p.grad is not None:
            p.grad.detach_()  # autograd refuses this on a view: bucket-view .grads must not be views
            if step % 2 == 0:
                p.grad = None
            else:
                p.grad.zero_()


def _train(model, x, y, shard, after_backward=None):
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        zero_grad_as_libtorch(list(model.parameters()), step)
        torch.nn.functional.mse_loss(model(x[step][shard]), y[step][shard]).backward()
        if after_backward is not None:
            after_backward(step)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _options(ffi, lib, hook, flags):
    o = ffi.new("pb_reducer_options *")
    o.size, o.op, o.flags = ffi.sizeof("pb_reducer_options"), lib.PB_AVG, flags
    o.hook, o.hook_rank, o.gossip_topology, o.hook_start_iter = lib.PB_HOOK_ALLREDUCE, 1, lib.PB_GOSSIP_NONE, 2
    if hook == "gossip":
        o.gossip_topology = lib.PB_GOSSIP_CUBE
    elif hook != "allreduce":
        o.hook = getattr(lib, f"PB_HOOK_{hook.upper()}")
    return o


def _torch_ddp(model, hook):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as psgd
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook == "bf16":
        # torch's own hook, under another name: torch DDP refuses the name itself off NCCL.
        ddp.register_comm_hook(None, lambda state, bucket: default_hooks.bf16_compress_hook(state, bucket))
    elif hook == "powersgd":
        ddp.register_comm_hook(psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                  start_powerSGD_iter=2, warm_start=True, random_seed=0),
                               psgd.powerSGD_hook)
    return ddp


def attached_training(rank, world, device="cpu"):
    import torch
    torch.set_default_device(device)  # the models, and the data moved below
    ffi, lib = load()
    g = init_world(ffi, lib, device=device)
    x, y = (t.to(device) for t in _data(world))
    mine = slice(6 * rank, 6 * rank + 6)
    sequential = _train(_model(), x, y, slice(None))
    results = {}
    for hook, twin in HOOKS.items():
        reference = sequential if twin is None else _train(_torch_ddp(_model(), twin), x, y, mine)
        for mode, flags in (("copy", 0), ("view", lib.PB_REDUCER_BUCKET_VIEW)):
            model = _model()
            params = list(model.parameters())
            h = Handles(ffi, lib)
            rp = ffi.new("pb_reducer **")
            rc = lib.pb_reducer_attach(g, len(params), h.array(params), _options(ffi, lib, hook, flags), rp)
            assert rc == 0, (hook, mode, last_error(ffi, lib))
            r = rp[0]
            moved = []

            def in_place(step, r=r, params=params, moved=moved):
                d = ffi.new("pb_tensor *")
                for i, p in enumerate(params):  # bucket view: .grad is the bucket's memory, no copy
                    assert lib.pb_reducer_grad(r, i, d) == 0
                    moved += [step] if p.grad.data_ptr() != int(ffi.cast("uintptr_t", d.data)) else []
                assert lib.pb_reducer_wait(r, 0) == 0, last_error(ffi, lib)  # backward reduced already: PB_OK

            got = _train(model, x, y, mine, in_place)
            assert lib.pb_reducer_close(r) == 0, last_error(ffi, lib)
            shared = {p.grad.untyped_storage().data_ptr() for p in params}
            diff = max((a - b).abs().max().item() for a, b in zip(got, reference))
            results[f"{hook}/{mode}"] = (diff, moved if mode == "view" else [], len(shared) == len(params))
    assert lib.pb_finalize(g) == 0
    return results


def test_attached_reducer_matches_torch_ddp_and_sequential():
    """20 steps of SGD, both modes, every built-in hook: within 1e-5 of torch's DDP with
    torch's own hook (allreduce, fp16, bf16, PowerSGD), or of one process on the whole
    batch (hierarchical, gossip on 2 ranks: exact averages). In bucket-view mode every
    .grad is its bucket's memory after each backward (re-pointed after zero_grad set it to
    None); after close each parameter has a gradient of its own."""
    results = run_ranks(attached_training, 2, timeout=150)
    for rank, res in enumerate(results):
        for name, (diff, moved, own) in res.items():
            assert diff < 1e-5, (rank, name, diff)
            assert not moved, (rank, name, "grad not a bucket view at steps", moved)
            assert own, (rank, name, "after close, parameters still share gradient memory")


def attach_refusals(rank, world):
    import torch
    ffi, lib = load()
    g = init_world(ffi, lib)
    h = Handles(ffi, lib)
    rp = ffi.new("pb_reducer **")
    out = {}
    leaf = torch.zeros(3, requires_grad=True)
    cases = {
        "no_grad": [h(torch.zeros(3))],
        "not_leaf": [h(leaf * 2)],
        "int": [h(torch.zeros(3, dtype=torch.int32, requires_grad=False))],
    }
    for name, descs in cases.items():
        arr = ffi.new("pb_tensor[]", len(descs))
        for i, d in enumerate(descs):
            arr[i] = d[0]
        out[name] = (lib.pb_reducer_attach(g, len(descs), arr, ffi.NULL, rp), last_error(ffi, lib))
    raw = ffi.new("pb_tensor[]", 1)
    raw[0].data, raw[0].count, raw[0].dtype, raw[0].device = ffi.new("float[3]"), 3, lib.PB_FLOAT32, lib.PB_CPU
    out["raw"] = (lib.pb_reducer_attach(g, 1, raw, ffi.NULL, rp), last_error(ffi, lib))
    o = _options(ffi, lib, "allreduce", lib.PB_REDUCER_BUCKET_VIEW)
    out["view_on_create"] = (lib.pb_reducer_create(g, 1, ffi.new("int64_t[]", [3]), ffi.new("int32_t[]", [0]), o, rp),
                             last_error(ffi, lib))
    assert lib.pb_reducer_attach(g, 1, h.array([leaf]), ffi.NULL, rp) == 0, last_error(ffi, lib)
    out["mark"] = (lib.pb_reducer_mark_ready(rp[0], 0), last_error(ffi, lib))
    assert lib.pb_reducer_close(rp[0]) == 0
    assert lib.pb_finalize(g) == 0
    return out


def test_attach_refusals():
    from pybridge import abi
    out = run_ranks(attach_refusals, 2, timeout=60)[0]
    assert all(rc == abi.PB_ERR_INVALID_ARGUMENT for rc, _ in out.values()), out
    assert "params[0]" not in out["no_grad"][1] and "parameter #0 does not require grad" in out["no_grad"][1]
    assert "is not a leaf tensor" in out["not_leaf"][1]
    assert "does not require grad" in out["int"][1]  # integer tensors never can
    assert "params[0] is not a libtorch tensor handle" in out["raw"][1]
    assert "PB_REDUCER_BUCKET_VIEW goes with pb_reducer_attach" in out["view_on_create"][1]
    assert "pb_reducer_mark_ready on a reducer from pb_reducer_attach" in out["mark"][1]


def attachment_alone(rank, world):
    import torch
    import pybridge
    from pybridge.ddp.attach import Attachment
    from pybridge.ddp.reducer import Reducer
    g = pybridge.init(backend="gloo", timeout=20)
    model, twin = _model(), _model()
    # Parameters listed in another order than backward finishes them, one bucket each: the
    # first wait rebuilds the buckets (a new generation), and rebind() lays them out again.
    order = [2, 3, 0, 1]
    params = [list(model.parameters())[i] for i in order]
    twins = [list(twin.parameters())[i] for i in order]
    r = Reducer(params, group=g, bucket_cap_mb=1e-6)
    a = Attachment(r, params, bucket_view=True)
    generations = []
    for step in range(4):
        if step == 2:
            r.rebind(g)  # what an elastic reset does with the new world's group
        for p, q in zip(params, twins):
            p.grad = q.grad = None
        x = torch.randn(5, 8)
        model(x).sum().backward()
        twin(x).sum().backward()
        views = r.grads()  # .grad is each bucket's memory (a plain tensor over it, not a view)
        assert all(p.grad.data_ptr() == v.data_ptr() and p.grad._base is None for p, v in zip(params, views)), step
        assert all(torch.allclose(p.grad, q.grad) for p, q in zip(params, twins)), step
        generations.append(r.generation)
    # A reduction that failed at the end of backward is kept for the program to ask about
    # (pb_reducer_wait); a program that does not ask gets it from its next backward.
    from pybridge.errors import CommError
    a.error = CommError("bucket 0: the peer is gone")
    try:
        model(torch.randn(5, 8)).sum().backward()
        raised = ""
    except RuntimeError as exc:
        raised = str(exc)
    assert "bucket 0: the peer is gone" in raised, raised
    assert isinstance(a.take_error(), CommError) and a.take_error() is None
    a.close()
    r.close()
    assert all(p.grad.data_ptr() != v.data_ptr() for p, v in zip(params, views))
    pybridge.finalize()
    return generations


def test_attachment_in_python_alone():
    """The Python core alone (pybridge.ddp.attach), on one rank: .grad is the bucket view and
    equals local backward's after every step, across the rebuild after the first step and a
    rebind (an elastic reset's relayout); close gives each parameter its own again."""
    generations = run_ranks(attachment_alone, 1, timeout=60)[0]
    # rebuilt after the first step; rebind lays out the initial buckets and rebuilds again
    assert generations == [1, 1, 3, 3]


def uneven_inputs(rank, world):
    """Join on an attached reducer: rank 1 runs out after one step and joins; rank 0's later
    backward passes still finish (the joined rank shadows them with zero gradients), and
    their gradients are its own divided by the world size (torch Join's default)."""
    ffi, lib = load()
    g = init_world(ffi, lib)
    model, local = _model(), _model()
    params = list(model.parameters())
    h = Handles(ffi, lib)
    rp = ffi.new("pb_reducer **")
    o = _options(ffi, lib, "allreduce", lib.PB_REDUCER_JOIN)
    assert lib.pb_reducer_attach(g, len(params), h.array(params), o, rp) == 0, last_error(ffi, lib)
    r = rp[0]
    x, _ = _data(world)
    steps = 3 if rank == 0 else 1
    worst = 0.0
    for step in range(steps):
        for p, q in zip(params, local.parameters()):
            p.grad = q.grad = None
        model(x[step][:6]).sum().backward()
        local(x[step][:6]).sum().backward()
        assert lib.pb_reducer_wait(r, 0) == 0, last_error(ffi, lib)
        if step >= 1:  # rank 1 has joined: its share is zero, the sum is divided by 2
            worst = max(worst, max((p.grad - q.grad / world).abs().max().item()
                                   for p, q in zip(params, local.parameters())))
    root, shadowed = ffi.new("int32_t *"), ffi.new("int64_t *")
    assert lib.pb_reducer_join(r, root, shadowed) == 0, last_error(ffi, lib)
    assert lib.pb_reducer_close(r) == 0
    assert lib.pb_finalize(g) == 0
    return worst, root[0], shadowed[0]


def test_join_with_an_attached_reducer():
    (worst, root, shadowed0), (_, root1, shadowed1) = run_ranks(uneven_inputs, 2, timeout=90)
    assert worst < 1e-6
    assert root == root1 == 0 and shadowed0 == 0 and shadowed1 == 2


def state_by_handle(rank, world):
    """pb_state_commit / restore / sync with the parameters named by handle and an attached
    reducer (elastic training's state): the rollback writes libtorch's memory in place, the
    sync gives every rank rank 0's commit, and the attached reducer keeps reducing after."""
    import torch
    ffi, lib = load()
    g = init_world(ffi, lib)
    model = _model(seed=rank)  # different on each rank until the sync
    params = list(model.parameters())
    h = Handles(ffi, lib)
    rp = ffi.new("pb_reducer **")
    assert lib.pb_reducer_attach(g, len(params), h.array(params), _options(ffi, lib, "allreduce", 0), rp) == 0
    keep = [ffi.new("char[]", f"p{i}".encode()) for i in range(len(params))]  # a reference each (cffi)
    names = ffi.new("char *[]", keep)
    sp, step = ffi.new("pb_state **"), ffi.new("int64_t *")
    assert lib.pb_state_create(sp) == 0
    committed = [p.detach().clone() for p in params]
    assert lib.pb_state_commit(sp[0], 3, len(params), names, h.array(params), ffi.NULL, rp[0]) == 0, last_error(ffi, lib)
    with torch.no_grad():
        for p in params:
            p.add_(1.0)
    assert lib.pb_state_restore(sp[0], len(params), names, h.array(params), ffi.NULL, rp[0], step) == 0, last_error(ffi, lib)
    restored = step[0] == 3 and all(torch.equal(p.detach(), c) for p, c in zip(params, committed))
    assert lib.pb_state_sync(sp[0], g, 0, len(params), names, h.array(params), ffi.NULL, rp[0], step) == 0, last_error(ffi, lib)
    x, _ = _data(world)
    model(x[0][6 * rank:6 * rank + 6]).sum().backward()
    assert lib.pb_reducer_wait(rp[0], 0) == 0, last_error(ffi, lib)
    assert lib.pb_state_close(sp[0]) == 0 and lib.pb_reducer_close(rp[0]) == 0
    assert lib.pb_finalize(g) == 0
    # Plain lists: tensors sent back through multiprocessing's queue would travel as shared
    # memory that the exiting rank no longer serves.
    return restored, [p.tolist() for p in params], [p.grad.tolist() for p in params]


def test_elastic_state_by_handle_with_an_attached_reducer():
    (restored0, params0, grads0), (restored1, params1, grads1) = run_ranks(state_by_handle, 2, timeout=90)
    assert restored0 and restored1
    assert params0 == params1  # rank 0's commit everywhere
    assert grads0 == grads1  # then reduced together
