"""The comm-hook contract: what a hook is given, what it returns, and what every rank must
agree on about it (torch's DDP comm-hook contract).

A hook is `hook(state, bucket) -> torch.futures.Future` whose value is the communicated
bucket (a tensor of the bucket's size, or a one-element list of it, as torch's allreduce
futures give). The reducer owns gradient readiness, launch order and bucket rebuilds; it
calls the hook once per full bucket, in bucket order, and when the future is done copies its
value into the bucket (unless the hook wrote the bucket's buffer itself). So torch's own
hooks (torch.distributed.algorithms.ddp_comm_hooks: allreduce_hook, fp16_compress_hook,
bf16_compress_hook, powerSGD_hook) run unmodified on pybridge's reducer, and pybridge's
hooks run on torch's DDP.

The bucket (GradBucket) offers what torch's GradBucket does: buffer(), index(), is_last(),
gradients(), parameters(), set_buffer().

Hooks declare what the reducer may rely on: `declare_eager` (all collectives issued before
the hook returns), `declare_sums` (the hook sums what it is given) and `declare_prepared`
(the hook reads only the bucket's buffer and scale, and can be prepared once per bucket). What a hook and its
state provide is stated by Protocols: `CommHook` (the call), `HookState` (`settings()`: what
every rank must share, in `identity`; required of a registered hook's state),
`StepCounting` (`STEP_ATTR`: the counter a checkpoint keeps) and `Closing` (`close()`: the
reducer closes a state it releases). This module imports no hook: the hooks import it.
"""

import functools
import warnings
from typing import Any, Callable, Optional, Protocol, Sequence, TypeVar, runtime_checkable

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as _torch_hooks

from ..errors import InvalidArgument

_Hook = TypeVar("_Hook", bound=Callable[..., Any])


class GradBucket:
    """One full bucket, as a hook sees it (torch.distributed.GradBucket's methods)."""

    __slots__ = ("_index", "_buffer", "_grads", "_params", "_last", "scale")

    def __init__(self, index: int, buffer: torch.Tensor, grads: Sequence[torch.Tensor],
                 params: Optional[Sequence[torch.Tensor]], last: bool, scale: Optional[float] = None) -> None:
        self._index = index
        self._buffer = buffer
        self._grads = grads
        self._params = params
        self._last = last
        # pybridge's own hooks only: a factor the reducer left for the hook to fold into its
        # first pass over the buffer (the 1/size of 'avg'), or None.
        self.scale = scale

    def index(self) -> int:
        """The bucket's place in launch order (0 first)."""
        return self._index

    def buffer(self) -> torch.Tensor:
        """The bucket's flat gradients (one dtype, one device)."""
        return self._buffer

    def set_buffer(self, tensor: torch.Tensor) -> None:
        """Replace the flat gradients (torch's GradBucket.set_buffer)."""
        self._buffer = tensor

    def is_last(self) -> bool:
        """True for the last bucket of the iteration (hooks that count steps use it)."""
        return self._last

    def gradients(self) -> list[torch.Tensor]:
        """Each parameter's gradient: views into buffer(), in the bucket's layout order."""
        return list(self._grads)

    def parameters(self) -> list[torch.Tensor]:
        """The parameters of the bucket's gradients, in the same order (a reducer built from
        tensors; one built from specs, as C and Go build them, has none)."""
        if self._params is None:
            raise InvalidArgument("this reducer was built from parameter specs (C, Go), not tensors: "
                                  "bucket.parameters() is unknown; use gradients()")
        return list(self._params)


@runtime_checkable
class CommHook(Protocol):
    """hook(state, bucket) -> torch.futures.Future whose value is the communicated bucket.

    Positional and with `bucket: Any`, so that torch's hooks, whose parameters are named
    otherwise (`process_group`) and typed for torch's GradBucket, are CommHooks to a type
    checker too (pybridge's GradBucket has torch's methods, not its type)."""

    def __call__(self, state: Any, bucket: Any, /) -> "torch.futures.Future[Any]": ...


@runtime_checkable
class HookState(Protocol):
    """settings(): what every rank must share about the state ({} for nothing), compared in identity()."""

    def settings(self) -> dict[str, Any]: ...


@runtime_checkable
class StepCounting(Protocol):
    """STEP_ATTR: the name of the state's step counter, which a checkpoint keeps."""

    STEP_ATTR: str


@runtime_checkable
class Closing(Protocol):
    """close(): release what the state holds (threads, groups); the reducer calls it."""

    def close(self) -> None: ...


class HookContext:
    """The `state` of pybridge's built-in hooks: the group, and wire buffers per bucket.
    The wire type belongs to the hook (fp16_compress_hook sends float16 whatever the
    state says), as in torch. A HookState with no settings."""

    def __init__(self, group: Any, dtype: Optional[torch.dtype] = None) -> None:
        if dtype is not None:
            warnings.warn("HookContext(dtype=...) is ignored: the wire type is bound in the hook "
                          "(fp16_compress_hook, bf16_compress_hook); use HookContext(group)",
                          DeprecationWarning, stacklevel=2)
        self.group = group
        self._scratch: dict[int, torch.Tensor] = {}

    def scratch(self, index: int, like: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """A reusable wire buffer of `dtype` (default: like's) for bucket `index`
        (allocated once per layout)."""
        dtype = like.dtype if dtype is None else dtype
        buf = self._scratch.get(index)
        if buf is None or buf.numel() != like.numel() or buf.device != like.device or buf.dtype != dtype:
            buf = self._scratch[index] = torch.empty(like.numel(), dtype=dtype, device=like.device)
        return buf

    def settings(self) -> dict[str, Any]:
        """Nothing every rank must share beyond the hook itself."""
        return {}


# Hooks that issue every collective before returning: torch's simple ones, and pybridge's
# (each declares itself where it is defined).
_EAGER: set[Callable[..., Any]] = {_torch_hooks.allreduce_hook, _torch_hooks.fp16_compress_hook,
                                   _torch_hooks.bf16_compress_hook}
_SUMS: set[Callable[..., Any]] = set()


def declare_eager(hook: _Hook) -> _Hook:
    """Declare that `hook` issues all of its collectives before it returns, none from its
    future's callbacks (as torch's allreduce and fp16/bf16 hooks do). The reducer then
    starts each bucket's hook as soon as the bucket is ready, so buckets travel
    concurrently. Any other hook starts once the previous bucket's future is done:
    collectives issued from callbacks (PowerSGD's) could otherwise go out in another order
    on each rank. Returns `hook` (usable as a decorator)."""
    _EAGER.add(hook)
    return hook


def is_eager(hook: Callable[..., Any]) -> bool:
    """Was `hook` declared eager (declare_eager)?"""
    try:
        return hook in _EAGER
    except TypeError:  # an unhashable callable: not declared
        return False


def declare_sums(hook: _Hook) -> _Hook:
    """Declare that `hook` sums what it is given and applies `bucket.scale`: the reducer then
    folds the 1/size of 'avg' into its gradient copy instead of dividing afterwards. For
    pybridge's own hooks (torch's GradBucket has no scale). Returns `hook`."""
    _SUMS.add(hook)
    return hook


def prescales(hook: Callable[..., Any]) -> bool:
    """Does `hook` sum what it is given (so the reducer may pre-divide for 'avg')?"""
    try:
        return hook in _SUMS
    except TypeError:
        return False


# hook -> prepare(state, buffer) -> launch(scale) -> Future (declare_prepared)
_PREPARED: dict[Callable[..., Any], Callable[[Any, torch.Tensor], Callable[[Optional[float]], Any]]] = {}


def declare_prepared(prepare: Callable[[Any, torch.Tensor], Callable[[Optional[float]], Any]]
                     ) -> Callable[[_Hook], _Hook]:
    """Declare that `hook(state, bucket)` reads nothing of the bucket but its buffer and its
    scale, and that `prepare(state, buffer)` returns `launch(scale)`, which does what the
    hook does for a bucket over `buffer` with that scale. The reducer prepares each
    bucket's launch once per layout and calls it every iteration: argument checks and the
    bucket object are not paid per bucket per step. A decorator: `@declare_prepared(prep)`."""
    def mark(hook: _Hook) -> _Hook:
        _PREPARED[hook] = prepare
        return hook
    return mark


def prepared(hook: Callable[..., Any]) -> Optional[Callable[[Any, torch.Tensor], Callable[[Optional[float]], Any]]]:
    """`hook`'s prepare function (declare_prepared), or None."""
    try:
        return _PREPARED.get(hook)
    except TypeError:  # an unhashable callable: not declared
        return None


def _name(obj: Any) -> str:
    if isinstance(obj, functools.partial):
        return f"partial({_name(obj.func)})"
    return f"{getattr(obj, '__module__', None) or '?'}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _describe(hook: Callable[..., Any], state_type: type, settings: dict[str, Any]) -> str:
    if state_type is type(None):
        return _name(hook)
    return f"{_name(hook)}({', '.join([f'state {_name(state_type)}'] + [f'{k} {v!r}' for k, v in settings.items()])})"


def _settings(state: Any) -> dict[str, Any]:
    """The settings of a known hook state that every rank must share ({} for others): a
    typed dispatch, so a renamed class is an error here and not a silently empty row."""
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    if isinstance(state, HookState) and callable(state.settings):  # pybridge's and registered hooks' states
        return state.settings()
    if isinstance(state, PostLocalSGDState):
        return {"start_localSGD_iter": state.start_localSGD_iter,
                "post_local_gradient_allreduce": state.post_local_gradient_allreduce}
    if isinstance(state, PowerSGDState):
        return {"rank": state.matrix_approximation_rank, "start_iter": state.start_powerSGD_iter,
                "warm_start": state.warm_start, "error_feedback": state.use_error_feedback,
                "min_compression_rate": state.min_compression_rate,
                "batch_same_shape": state.batch_tensors_with_same_shape}
    return {}


def identity(state: Any, hook: Callable[..., Any]) -> str:
    """What every rank must agree on about a hook, readable: the function by module and
    qualified name, the state's type and, for pybridge's and torch's known states, their
    settings. 'pybridge.algorithms.default_hooks.fp16_compress_hook(state pybridge.algorithms.contract.HookContext)'."""
    return _describe(hook, type(state), _settings(state))


def _step_attr(state: Any) -> Optional[str]:
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    if isinstance(state, StepCounting) and state.STEP_ATTR is not None:  # pybridge's hook states
        return state.STEP_ATTR
    if isinstance(state, (PowerSGDState, PostLocalSGDState)):
        return "iter"
    return None


def hook_step(state: Any) -> Optional[int]:
    """The step counter of a hook state that a checkpoint keeps (GossipGraD's step, PowerSGD's
    and post-local SGD's iteration), or None for states without one."""
    attr = _step_attr(state)
    step: Optional[int] = None if attr is None else getattr(state, attr)
    return step


def set_hook_step(state: Any, step: int) -> None:
    """Restore hook_step()'s counter; a state without one ignores it."""
    attr = _step_attr(state)
    if attr is not None:
        setattr(state, attr, step)


__all__ = ["GradBucket", "HookContext", "CommHook", "HookState", "StepCounting", "Closing", "declare_eager", "is_eager", "declare_sums", "prescales",
           "declare_prepared", "prepared", "identity",
           "hook_step", "set_hook_step"]
