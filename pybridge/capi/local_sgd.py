"""C ABI functions for periodic model averaging (pybridge.algorithms.local_sgd). Conversion only: the
schedule and the averaging live in the core."""

from .. import capi
from ..algorithms import local_sgd as _local_sgd
from ..base.checks import integer
from ..errors import InvalidArgument
from . import handles, live_group, put, tensor_array


def _get(ptr):
    return handles.get(ptr, _local_sgd.PeriodicModelAverager, "averager")


def pb_average_params(group, n, tensors):
    _local_sgd.average_parameters(tensor_array(n, tensors, "tensors"), group=live_group(group))


def pb_averager_create(group, period, warmup_steps, out):
    avg = _local_sgd.PeriodicModelAverager(period, warmup_steps, process_group=live_group(group))
    handles.add(avg, "pb_averager *", out)


def pb_averager_create_hierarchical(group, nlevels, periods, group_sizes, warmup_steps, out):
    g = live_group(group)
    integer("nlevels", nlevels, low=1)
    if periods == capi.ffi.NULL or group_sizes == capi.ffi.NULL:
        raise InvalidArgument(f"{'periods' if periods == capi.ffi.NULL else 'group_sizes'} is NULL")
    if out == capi.ffi.NULL:
        raise InvalidArgument("out (the pointer to store the handle in) is NULL")
    levels = {}
    for i in range(nlevels):
        if periods[i] in levels:
            raise InvalidArgument(f"periods[{i}] = {periods[i]} repeats an earlier period; periods must increase")
        levels[int(periods[i])] = int(group_sizes[i])
    avg = _local_sgd.HierarchicalModelAverager(levels, warmup_steps, process_group=g)
    handles.add(avg, "pb_averager *", out)


def pb_averager_step(averager, n, tensors, averaged):
    avg = _get(averager)
    did = avg.average_parameters(tensor_array(n, tensors, "tensors"))
    if averaged != capi.ffi.NULL:
        averaged[0] = int(did)


def pb_averager_get_step(averager, out):
    put(out, _get(averager).step)


def pb_averager_set_step(averager, step):
    _get(averager).load_state_dict({"step": step})


def pb_averager_close(averager):
    handles.remove(averager, _local_sgd.PeriodicModelAverager, "averager").close()
