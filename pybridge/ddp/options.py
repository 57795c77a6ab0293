"""torch DistributedDataParallel's constructor keywords, checked and mapped onto pybridge's.

Each torch 2.13 keyword is accepted with torch's meaning or refused with NotSupported
saying why (docs/python-api.md has the table); torch's own rules and messages are kept
where torch checks an argument, as pybridge errors (InvalidArgument is a ValueError,
InvalidState and NotSupported are RuntimeErrors, as torch raises them)."""

import warnings

import torch

from ..comm import group as _group
from ..comm import world as _world
from ..errors import InvalidArgument, InvalidState, NotSupported


def trainable(module, ignore):
    """(names, parameters) that DDP reduces: those requiring grad, minus torch's ignore list
    (module._ddp_params_and_buffers_to_ignore). Refuses a module with none, as torch does."""
    named = [(n, p) for n, p in module.named_parameters() if n not in ignore]
    if not any(p.requires_grad for _, p in named):
        raise InvalidState("DistributedDataParallel is not needed when a module doesn't have any parameter "
                           "that requires a gradient (torch DDP refuses it too): nothing would be reduced")
    for n, p in named:
        if isinstance(p, torch.nn.parameter.UninitializedParameter):
            raise InvalidState(f"parameter {n} is uninitialized (a lazy module): run a dummy forward pass to "
                               "initialize it before wrapping the module in DistributedDataParallel")
    named = [(n, p) for n, p in named if p.requires_grad]
    return [n for n, _ in named], [p for _, p in named]


def ignored(module):
    return set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))


def resolve_group(group, process_group, device_mesh):
    """The pybridge Group from pybridge's group=, torch's process_group= (a torch
    ProcessGroup, torch's default group included, or a pybridge Group) or a 1-D device_mesh."""
    given = [k for k, v in (("group", group), ("process_group", process_group), ("device_mesh", device_mesh))
             if v is not None]
    if len(given) > 1:
        raise InvalidArgument(f"give one of group=, process_group= and device_mesh=, got {' and '.join(given)}")
    if device_mesh is not None:
        if getattr(device_mesh, "ndim", None) != 1:
            raise NotSupported(f"only a 1-D device mesh is supported (as in torch DDP), got {device_mesh}")
        if device_mesh._get_root_mesh() != device_mesh:
            raise NotSupported("a device mesh sliced from a larger one (DDP with tensor parallelism) is not "
                               "supported: pybridge does not transform the module for tensor parallelism")
        process_group = device_mesh.get_group(mesh_dim=0)
    g = group if group is not None else process_group
    if g is None:
        return _world.current()
    if isinstance(g, _group.Group):
        return g
    return _world.from_torch(g)


def devices(params, device_ids, output_device):
    """(device_ids, output_device) by torch's rules: one device per process; None for CPU
    modules and modules spread over several devices."""
    if device_ids is not None and len(device_ids) > 1:
        raise InvalidArgument("device_ids can only be None or contain a single element (one device per "
                              f"process, as in torch DDP), got {list(device_ids)}")
    kinds = {p.device.type for p in params}
    if len(kinds) != 1:
        raise InvalidArgument("DistributedDataParallel's input module must be on the same type of devices, "
                              f"but its parameters are on {sorted(kinds)}")
    several = len({p.device for p in params}) > 1
    if not device_ids or kinds == {"cpu"} or several:
        if device_ids or output_device:
            raise InvalidArgument(
                "device_ids and output_device only work with single-device GPU modules: for CPU modules "
                "and modules on several devices they must be None (as torch DDP requires), but got "
                f"device_ids {device_ids}, output_device {output_device}, and module parameters "
                f"{sorted({str(p.device) for p in params})}")
        return None, None
    ids = [torch._utils._get_device_index(d, True) for d in device_ids]
    out = torch._utils._get_device_index(device_ids[0] if output_device is None else output_device, True)
    return ids, out


def buffer_sync(broadcast_buffers, forward_sync_buffers):
    """(sync buffers before forward, sync buffers at construction), torch 2.13's rule:
    forward_sync_buffers wins over broadcast_buffers and always syncs at construction;
    broadcast_buffers=False also skips the construction-time sync."""
    if forward_sync_buffers is not None:
        return bool(forward_sync_buffers), True
    b = True if broadcast_buffers is None else bool(broadcast_buffers)
    return b, b


def refuse(mixed_precision, delay_all_reduce_named_params, param_to_hook_all_reduce, bucket_cap_mb_list,
           check_reduction):
    """Refuse what pybridge does not offer, saying why; warn for what torch deprecated."""
    if (delay_all_reduce_named_params is None) != (param_to_hook_all_reduce is None):
        raise InvalidArgument("delay_all_reduce_named_params and param_to_hook_all_reduce need to be set at "
                              "the same time")
    if delay_all_reduce_named_params is not None:
        raise NotSupported("delay_all_reduce_named_params / param_to_hook_all_reduce are not supported: "
                           "pybridge reduces every trainable parameter through its bucketed reducer, in "
                           "backward (torch's delayed allreduce serves torch.compile pipelines)")
    if mixed_precision is not None:
        raise NotSupported("mixed_precision (torch's prototype _MixedPrecision: low-precision parameter "
                           "copies for forward) is not supported; use torch.autocast for the forward pass, "
                           "or compression='bf16'/'fp16' to send gradients in half precision")
    if bucket_cap_mb_list:
        raise NotSupported("bucket_cap_mb_list (a cap per bucket) is not supported; use bucket_cap_mb and "
                           "first_bucket_cap_mb (pybridge's keyword for the first bucket's cap)")
    if check_reduction:
        warnings.warn("The `check_reduction` argument in `DistributedDataParallel` module is deprecated "
                      "(torch ignores it too). Please avoid using it.", FutureWarning, stacklevel=3)


def check_picklable(group):
    """As torch, only a wrapper on the world group may be pickled: pickles keep no group, and
    the loaded wrapper is rebuilt on the world of the loading process."""
    if group.parent is not None:
        raise InvalidState("DDP Pickling/Unpickling are only supported when using DDP with the default "
                           f"process group (the world); this wrapper was built on {group.describe()}")
