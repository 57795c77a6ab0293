"""Subgroups on 4 real ranks (split, new_group, node groups, nesting, group-relative ranks,
reducer and loader on a subgroup, close and finalize), and adopting torch's own group."""

import os

import torch
import torch.nn.functional as F

from pybridge import recordio as rio
from ranks import run_ranks


def _fails(fn, kind):
    try:
        fn()
    except kind as exc:
        return str(exc)
    raise AssertionError(f"{fn} did not raise {kind.__name__}")


def subgroup_suite(rank, world, data_dir):
    import pybridge
    from pybridge.errors import Closed, InvalidArgument
    from pybridge.ddp.reducer import Reducer
    g = pybridge.init(backend="gloo", timeout=30)
    out = {}

    # Two disjoint pairs reduce different data at the same time, each on its own subgroup.
    pair = g.split(rank // 2)
    assert pair.size == 2 and pair.ranks == ((0, 1) if rank < 2 else (2, 3)) and pair.rank == rank % 2
    x = torch.full((1000,), float(rank + 1))
    pybridge.all_reduce(x, group=pair)
    out["pair_sum"] = x[0].item()

    # Group-relative ranks: root 1 of pair {2, 3} is global rank 3; point-to-point by group rank.
    y = torch.full((3,), float(rank))
    pybridge.broadcast(y, 1, group=pair)
    out["pair_bcast"] = y[0].item()
    t = torch.full((4,), float(rank * 10))
    if pair.rank == 0:
        pybridge.send(t, 1, group=pair)
    else:
        pybridge.recv(t, 0, group=pair)
    out["p2p"] = t[0].item()
    assert pair.global_rank_of(1) == pair.ranks[1] and pair.group_rank_of(rank) == pair.rank
    assert "not a member" in _fails(lambda: pair.group_rank_of((rank + 2) % 4), InvalidArgument)
    assert "out of range" in _fails(lambda: pybridge.broadcast(y, 2, group=pair), InvalidArgument)

    # split's key orders the members: reversed here, so group rank 0 is global rank 3.
    rev = g.split(0, key=-rank)
    assert rev.ranks == (3, 2, 1, 0) and rev.rank == 3 - rank
    z = torch.full((2,), float(rank))
    pybridge.broadcast(z, 0, group=rev)
    out["rev_root"] = z[0].item()
    gathered = torch.zeros(4)
    pybridge.all_gather(torch.tensor([float(rank)]), gathered, group=rev)
    out["rev_gather"] = gathered.tolist()

    # Nested: split a subgroup of the even and odd ranks again; a negative color joins nothing.
    parity = g.split(rank % 2)
    solo = parity.split(parity.rank, key=0)
    assert solo.size == 1 and solo.ranks == (rank,)
    assert g.split(-1) is None and g.split(None) is None
    # A subgroup may name its own backend (gloo beside an NCCL world: CPU control messages).
    cpu = g.split(0, backend="gloo")
    assert cpu.backend == "gloo" and cpu.device.type == "cpu"
    c = torch.tensor([1.0])
    pybridge.all_reduce(c, group=cpu)
    out["gloo_split"] = c.item()
    assert "unknown backend 'mpi'" in _fails(lambda: g.split(0, backend="mpi"), InvalidArgument)
    if not torch.cuda.is_available():
        assert "needs CUDA" in _fails(lambda: g.split(0, backend="nccl"), InvalidArgument)
    # new_group: ranks within the parent, members only (a non-member gets None at once).
    firsts = g.new_group([0, 2])
    assert (firsts is None) == (rank % 2 == 1)
    if firsts is not None:
        w = torch.tensor([float(rank)])
        pybridge.all_reduce(w, group=firsts)
        out["firsts"] = w.item()
    assert "more than once" in _fails(lambda: g.new_group([1, 1]), InvalidArgument)
    assert "out of range" in _fails(lambda: g.new_group([4]), InvalidArgument)

    # Node groups, pretending nodes of 2 ranks: intra {0,1} {2,3}, cross {0,2} {1,3}.
    intra, cross = pybridge.node_groups(2)
    out["nodes"] = (intra.ranks, cross.ranks)

    # The reducer on a subgroup averages within it.
    red = Reducer([(5, "float32")], group=pair)
    red.grad(0).fill_(float(rank))
    red.mark_ready(0)
    red.finalize()
    out["reducer"] = red.grad(0)[0].item()
    red.close()

    # The loader on a subgroup shares the data between the subgroup's ranks only.
    files = sorted(os.path.join(data_dir, f) for f in os.listdir(data_dir))
    with rio.Loader(files, 5, group=pair) as ld:
        out["static"] = [r for b in ld for r in b.tolist()]
    with rio.Loader(files, 5, group=pair, partition="dynamic") as ld:
        out["dynamic"] = [r for b in ld for r in b.tolist()]
    pybridge.barrier(group=pair)

    # A closed subgroup refuses use; finalize closes every subgroup and the loaders made from it.
    parity.close()
    assert "closed" in _fails(lambda: pybridge.all_reduce(x, group=parity), Closed)
    assert solo.closed  # the nested one went with it
    ld = rio.Loader(files, 5, group=pair, partition="dynamic")
    pybridge.barrier()
    pybridge.finalize()
    assert pair.closed and rev.closed and intra.closed
    _fails(lambda: pybridge.all_reduce(x, group=pair), Closed)
    _fails(lambda: ld.next_batch(), Closed)
    ld.close()
    return out


def test_subgroups_on_four_ranks(tmp_path):
    for f in range(2):
        rio.write_file(str(tmp_path / f"part-{f}.recordio"), [b"%d:%d" % (f, i) for i in range(20)], "none", 64)
    res = run_ranks(subgroup_suite, 4, str(tmp_path), timeout=120)
    assert [r["pair_sum"] for r in res] == [3.0, 3.0, 7.0, 7.0]
    assert [r["pair_bcast"] for r in res] == [1.0, 1.0, 3.0, 3.0]
    assert [r["p2p"] for r in res] == [0.0, 0.0, 20.0, 20.0]
    assert [r["rev_root"] for r in res] == [3.0] * 4
    assert all(r["rev_gather"] == [3.0, 2.0, 1.0, 0.0] for r in res)  # in the group's rank order
    assert [r.get("firsts") for r in res] == [2.0, None, 2.0, None]
    assert [r["gloo_split"] for r in res] == [4.0] * 4
    assert [r["nodes"] for r in res] == [((0, 1), (0, 2)), ((0, 1), (1, 3)), ((2, 3), (0, 2)), ((2, 3), (1, 3))]
    assert [r["reducer"] for r in res] == [0.5, 0.5, 2.5, 2.5]
    everything = sorted(b"%d:%d" % (f, i) for f in range(2) for i in range(20))
    for pair in ((0, 1), (2, 3)):
        for mode in ("static", "dynamic"):
            got = res[pair[0]][mode] + res[pair[1]][mode]
            assert sorted(got) == everything, (pair, mode)  # each pair reads all, once


def adopt_torch_group(rank, world):
    import torch.distributed as dist

    import pybridge
    dist.init_process_group("gloo")  # the program set torch.distributed up itself
    torch.manual_seed(0)
    ours = pybridge.DistributedDataParallel(torch.nn.Linear(6, 3))
    torch.manual_seed(0)
    theirs = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(6, 3))
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
    for net in (ours, theirs):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(net(x), y).backward()
            opt.step()
    diff = max((a - b).abs().max().item() for a, b in zip(ours.parameters(), theirs.parameters()))
    v = torch.tensor([1.0])
    pybridge.all_reduce(v)
    assert pybridge.current().size == world and pybridge.rank() == rank
    pybridge.finalize()
    alive = dist.is_initialized()  # pybridge did not create it, so it left it alive
    w = torch.tensor([1.0])
    dist.all_reduce(w)
    # torch's DDP goes before the group: holding the group's last reference, its C++ Reducer
    # frees the group with the GIL held, and the group's destructor joins a gloo thread that
    # needs the GIL to free the tensors of the work it just finished (a deadlock: 3 of 26 runs
    # of this function hung, in three loops at once, and a hung rank's stack showed it; with
    # this order none of 180).
    del ours, theirs, net, opt
    dist.destroy_process_group()
    return diff, v.item(), alive, w.item()


def test_adopts_a_group_torch_set_up():
    for diff, v, alive, w in run_ranks(adopt_torch_group, 2, timeout=90):
        assert diff < 1e-6 and v == 2.0 and alive and w == 2.0
