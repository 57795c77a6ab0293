"""pybridge's simple hooks: allreduce, and float32 buckets compressed to fp16 or bf16 on the
wire, plus torch's PowerSGD over a pybridge group (for C and Go callers). Each follows the
contract of contract.py and declares what the reducer may rely on."""

from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch._C._distributed_c10d import GradBucket as TorchGradBucket  # torch.distributed.GradBucket

from ..comm import collectives
from ..comm.group import Group
from ..base.checks import integer
from .contract import GradBucket, HookContext, declare_eager, declare_prepared, declare_sums

if TYPE_CHECKING:  # imported when a PowerSGD state is made, as before
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

_Future = torch.futures.Future


def _prepare_allreduce(ctx: HookContext, buf: torch.Tensor) -> "Callable[[Optional[float]], _Future[list[torch.Tensor]]]":
    """allreduce_hook for a bucket over `buf`, its arguments checked once: launch(scale)."""
    start = collectives.prepare_all_reduce_future(buf, collectives.SUM, group=ctx.group)

    def launch(scale: Optional[float]) -> "_Future[list[torch.Tensor]]":
        if scale is not None:
            buf.mul_(scale)
        return start()
    return launch


@declare_prepared(_prepare_allreduce)
@declare_sums
@declare_eager
def allreduce_hook(ctx: HookContext, bucket: GradBucket) -> "_Future[list[torch.Tensor]]":
    """Sum the bucket over the group (after applying the reducer's pending scale): the
    reducer's default hook. `ctx.group` None is the world.

    Example::

        >>> import torch, pybridge
        >>> from pybridge.algorithms.comm_hooks import HookContext, allreduce_hook
        >>> ddp_model = pybridge.DistributedDataParallel(torch.nn.Linear(4, 2))
        >>> ddp_model.register_comm_hook(HookContext(pybridge.current()), allreduce_hook)
        >>> ddp_model(torch.ones(3, 4)).sum().backward()   # the buckets go through the hook
    """
    return _prepare_allreduce(ctx, bucket.buffer())(bucket.scale)


def _compress(dtype: torch.dtype, ctx: HookContext, bucket: GradBucket) -> "_Future[Any]":
    buf = bucket.buffer()
    if buf.dtype != torch.float32:  # only float32 buckets are compressed
        return allreduce_hook(ctx, bucket)
    wire = ctx.scratch(bucket.index(), buf, dtype)
    if bucket.scale is not None:
        # Scaled in float32 first (no overflow), then converted: two vectorised passes,
        # 3.8x faster on CPU than torch.mul(buf, scale, out=wire), whose mixed-dtype
        # output takes a slow path (7.1 against 1.8 ms for 6.3M floats, one thread).
        buf.mul_(bucket.scale)
    wire.copy_(buf)

    def decompress(fut: "_Future[list[torch.Tensor]]") -> torch.Tensor:
        # In the future's callback, as torch's hook does: an early bucket is decompressed
        # while backward still runs, not at finalize.
        return buf.copy_(fut.value()[0])
    return collectives.all_reduce_future(wire, collectives.SUM, group=ctx.group).then(decompress)


@declare_sums
@declare_eager
def fp16_compress_hook(ctx: HookContext, bucket: GradBucket) -> "_Future[Any]":
    """float32 buckets travel as float16 (the type is the hook's, as in torch), summed, and
    are decompressed into the bucket; other dtypes travel as they are.

    Example::

        >>> import torch, pybridge
        >>> from pybridge.algorithms.comm_hooks import HookContext, fp16_compress_hook
        >>> ddp_model = pybridge.DistributedDataParallel(torch.nn.Linear(4, 2))
        >>> ddp_model.register_comm_hook(HookContext(pybridge.current()), fp16_compress_hook)
        >>> ddp_model(torch.ones(3, 4)).sum().backward()
    """
    return _compress(torch.float16, ctx, bucket)


@declare_sums
@declare_eager
def bf16_compress_hook(ctx: HookContext, bucket: GradBucket) -> "_Future[Any]":
    """float32 buckets travel as bfloat16 (on gloo too, unlike torch's bf16 hook).

    Example::

        >>> import torch, pybridge
        >>> from pybridge.algorithms.comm_hooks import HookContext, bf16_compress_hook
        >>> ddp_model = pybridge.DistributedDataParallel(torch.nn.Linear(4, 2))
        >>> ddp_model.register_comm_hook(HookContext(pybridge.current()), bf16_compress_hook)
        >>> ddp_model(torch.ones(3, 4)).sum().backward()
    """
    return _compress(torch.bfloat16, ctx, bucket)


def powersgd_state(group: Optional[Group], rank: int = 1, warm_start: bool = True, start_iter: int = 2,
                   seed: int = 0) -> "PowerSGDState":
    """torch's PowerSGDState for a pybridge group (None: a state that is only described,
    never run). `start_iter`: iterations of plain allreduce before compression starts
    (torch's start_powerSGD_iter; at least 2, as torch requires when error feedback is
    on); `rank`: the matrix approximation rank."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    for name, v, low in (("PowerSGD rank", rank, 1), ("PowerSGD start iteration", start_iter, 2)):
        integer(name, v, low=low, expected=f"an integer >= {low}")
    return psgd.PowerSGDState(process_group=None if group is None else group.pg,
                              matrix_approximation_rank=rank, start_powerSGD_iter=start_iter,
                              warm_start=bool(warm_start), random_seed=seed)


def powersgd_hook(state: "PowerSGDState", bucket: TorchGradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's PowerSGD hook (low-rank gradient compression) with a state from powersgd_state:
    plain allreduce for `start_iter` iterations, then rank-`rank` approximations. Annotated as
    torch's hooks are, which torch's DDP checks: it runs there too.

    Example::

        >>> import torch, pybridge
        >>> from pybridge.algorithms.comm_hooks import powersgd_hook, powersgd_state
        >>> ddp_model = pybridge.DistributedDataParallel(torch.nn.Linear(4, 2))
        >>> ddp_model.register_comm_hook(powersgd_state(pybridge.current(), rank=1), powersgd_hook)
        >>> ddp_model(torch.ones(3, 4)).sum().backward()
    """
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    return psgd.powerSGD_hook(state, bucket)


__all__ = ["allreduce_hook", "fp16_compress_hook", "bf16_compress_hook", "powersgd_state", "powersgd_hook"]
