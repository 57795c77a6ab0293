"""C ABI functions for subgroups (pybridge.comm.group): split, explicit member lists, node
groups, rank mapping, free. Conversion only."""

from .. import capi
from ..comm import subgroups
from ..comm import group as _group
from ..base.checks import integer
from ..errors import InvalidArgument
from . import handles, live_group, put


def _add_or_null(g, out, what="out"):
    if g is None:
        out[0] = capi.ffi.NULL
    else:
        handles.add(g, "pb_group *", out, what)


def _check_out(out, what="out"):
    if out == capi.ffi.NULL:
        raise InvalidArgument(f"{what} (the pointer to store the group handle in) is NULL")


def pb_group_split(parent, color, key, out):
    pb_group_split_backend(parent, color, key, capi.ffi.NULL, out)


def pb_group_split_backend(parent, color, key, backend, out):
    _check_out(out)
    g = live_group(parent)
    name = capi.text(backend)
    _add_or_null(subgroups.split(color if color >= 0 else None, key, group=g,
                                 backend=None if name in (None, "", "auto") else name), out)


def pb_group_set_stream(group, cuda_stream):
    live_group(group).set_stream(capi._address(cuda_stream) if cuda_stream != capi.ffi.NULL else None)


def pb_group_new(parent, ranks, n, out):
    g = live_group(parent)
    _check_out(out)
    integer("n", n, low=1, expected="at least 1 (a group needs a member)")
    if ranks == capi.ffi.NULL:
        raise InvalidArgument(f"ranks is NULL with n = {n}")
    _add_or_null(g.new_group([int(ranks[i]) for i in range(n)]), out)


def pb_group_nodes(parent, ranks_per_node, intra, cross):
    g = live_group(parent)
    _check_out(intra, "intra")
    _check_out(cross, "cross")
    a, b = subgroups.node_groups(ranks_per_node if ranks_per_node > 0 else None, group=g)
    handles.add(a, "pb_group *", intra)
    handles.add(b, "pb_group *", cross)


def pb_group_global_rank(group, group_rank, out):
    put(out, live_group(group).global_rank_of(group_rank))


def pb_group_rank_of(group, global_rank, out):
    put(out, live_group(group).group_rank_of(global_rank))


def pb_group_close(group):
    g = handles.get(group, _group.Group, "group")
    if g.parent is None:
        raise InvalidArgument("the world group is left with pb_finalize, not closed with pb_group_close")
    handles.remove(group, _group.Group, "group")
    if not g.closed:
        g.close()


pb_group_free = pb_group_close  # deprecated name (pybridge.h), the same function
