"""Observability: per-rank traces (Chrome Trace Event JSON), metrics (JSON lines,
TensorBoard, Prometheus), the program's own spans, instants, scalars and steps, and the
tools that read them (`merge`, `report`). docs/observability.md.

Off by default: nothing is recorded and the library's hot paths pay one comparison
(`state.REC is None`). On by `PYBRIDGE_TRACE=DIR` (traces and metrics files in DIR),
`PYBRIDGE_METRICS_PORT=PORT` (a Prometheus endpoint), `PYBRIDGE_OTEL=1` (OpenTelemetry
metrics, otel.py), `pybridge-launch --trace DIR --metrics-port PORT --otel`, or `start()` here; it starts when the process group is made (`init`),
which also measures this rank's clock against rank 0's, so the ranks' traces merge on one
time line.

    import pybridge
    from pybridge import observe
    observe.start("trace")                 # before init: clocks are aligned at init
    g = pybridge.init()
    with observe.span("forward"):          # the program's own span, on the program's track
        ...
    observe.scalar("loss", 0.25)           # at the current step
"""

import atexit
import functools
import os
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Optional, TypeVar, Union

from typing_extensions import ParamSpec

from ..errors import InvalidArgument
from . import state
from .clock import now_us

if TYPE_CHECKING:
    from .recorder import Recorder

_P = ParamSpec("_P")
_R = TypeVar("_R")
_Settings = dict[str, Any]

EVERY = 50  # steps per metrics row by default: a row (JSON line, TensorBoard) costs about 0.2 ms
KEEP_STEPS = 2000  # the trace holds the latest this many steps' events by default (0: all): memory stays bounded
CATEGORIES = ("user", "compute", "forward", "data", "comm", "checkpoint", "elastic")
_ENV_TRACE, _ENV_PORT, _ENV_ADDR, _ENV_EVERY, _ENV_TORCH, _ENV_OTEL, _ENV_STEPS = (
    "PYBRIDGE_TRACE", "PYBRIDGE_METRICS_PORT", "PYBRIDGE_METRICS_ADDR", "PYBRIDGE_METRICS_EVERY",
    "PYBRIDGE_TRACE_TORCH", "PYBRIDGE_OTEL", "PYBRIDGE_TRACE_STEPS")

_settings: Optional[_Settings] = None  # what start() asked for, applied at init (or at once after it)
_world: Optional[tuple[int, int, int]] = None  # (rank, world size, local rank) of the latest init
_server: Optional[tuple[Any, Any]] = None  # the Prometheus endpoint's (server, thread)
_otel: Any = None  # the OpenTelemetry exporter (otel.Exporter)


def _settings_from_env() -> Optional[_Settings]:
    trace = os.environ.get(_ENV_TRACE, "").strip() or None
    port = os.environ.get(_ENV_PORT, "").strip() or None
    every = os.environ.get(_ENV_EVERY, "").strip() or None
    otel = _env_flag(_ENV_OTEL)
    if trace is None and port is None and not otel:
        return None
    keep = os.environ.get(_ENV_STEPS, "").strip() or None
    return _check(trace, _env_int(_ENV_PORT, port), os.environ.get(_ENV_ADDR, "").strip() or None,
                  _env_int(_ENV_EVERY, every), _env_flag(_ENV_TORCH), otel, _env_int(_ENV_STEPS, keep),
                  source="environment")


def _env_flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
        raise InvalidArgument(f"environment variable {name}={raw!r}: use 1 or 0")
    return raw in ("1", "true", "yes", "on")


def _env_int(name: str, raw: Optional[str]) -> Optional[int]:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidArgument(f"environment variable {name}={raw!r}: expected an integer") from None


def _check(trace: Any, port: Any, addr: Optional[str], every: Any, torch_ops: bool = False, otel: bool = False,
           keep_steps: Any = None, source: str = "start()") -> _Settings:
    if trace is not None and (not isinstance(trace, (str, os.PathLike)) or not str(trace)):
        raise InvalidArgument(f"{source}: the trace directory must be a path, got {trace!r}")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535):
        raise InvalidArgument(f"{source}: the metrics port must be 0..65535, got {port!r}")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
        raise InvalidArgument(f"{source}: metrics every N steps needs N >= 1, got {every!r}")
    if torch_ops and trace is None:
        raise InvalidArgument(f"{source}: profiling libtorch's operations needs a trace directory")
    if keep_steps is not None and (isinstance(keep_steps, bool) or not isinstance(keep_steps, int) or keep_steps < 0):
        raise InvalidArgument(f"{source}: the steps a trace keeps must be >= 0 (0: all), got {keep_steps!r}")
    return {"trace": None if trace is None else os.fspath(trace), "port": port, "addr": addr or "127.0.0.1",
            "every": every or EVERY, "torch_ops": bool(torch_ops), "otel": otel,
            "keep_steps": KEEP_STEPS if keep_steps is None else keep_steps}


def start(trace: Union[str, "os.PathLike[str]", None] = None, *, metrics_port: Optional[int] = None,
          metrics_addr: Optional[str] = None, every: Optional[int] = None,
          torch_ops: bool = False, otel: Optional[bool] = None,
          keep_steps: Optional[int] = None) -> "Optional[Recorder]":
    """Record this rank: traces and metrics files into directory `trace`, and/or a Prometheus
    endpoint on `metrics_port` (bound to `metrics_addr`, default loopback; the port of local
    rank L is metrics_port + L), and/or OpenTelemetry metrics (`otel`; None: as
    PYBRIDGE_OTEL says; otel.py). `every`: steps per metrics row (default 50). `keep_steps`:
    the trace holds the events of the latest this many steps (default 2000, 0: all; the
    metrics count every step). `torch_ops`:
    also libtorch's operations on every thread, from torch.profiler (torchops.py; short
    runs). Call before init() (the recording starts there, with the clocks aligned) or
    after it (at once, clocks not aligned). Returns the rank's recorder once it records
    (after init), else None.

    Example::

        >>> import pybridge
        >>> from pybridge import observe
        >>> rec = observe.start("trace")           # trace/ gets this rank's trace and metrics
        >>> with observe.span("forward"):
        ...     pass
        >>> observe.scalar("loss", 0.25)
        >>> observe.stop()                         # also at exit; `pybridge report trace` reads them
    """
    global _settings
    if otel is None:
        otel = _env_flag(_ENV_OTEL)
    if trace is None and metrics_port is None and not otel:
        raise InvalidArgument("start() needs a trace directory, a metrics port or otel=True")
    _settings = _check(trace, metrics_port, metrics_addr, every, torch_ops, bool(otel), keep_steps)
    if _world is not None and state.REC is None:
        joined(*_world)
    return state.REC


def joined(rank: int, world_size: int, local_rank: int = 0) -> "Optional[Recorder]":
    """The process group was made (comm/group.py): start recording if asked to. Returns the
    recorder (new or kept from an earlier world), or None."""
    global _world, _server, _otel
    _world = (rank, world_size, local_rank)
    rec = state.REC
    if rec is not None:
        return rec
    settings = _settings or _settings_from_env()
    if settings is None:
        return None
    from .recorder import Recorder
    if settings["trace"]:
        try:
            os.makedirs(settings["trace"], exist_ok=True)
        except OSError as exc:
            raise InvalidArgument(f"cannot create the trace directory {settings['trace']!r}: "
                                  f"{exc.strerror or exc}") from None
    rec = Recorder(settings["trace"], rank=rank, world_size=world_size, local_rank=local_rank,
                   every=settings["every"], keep_steps=settings["keep_steps"])
    if settings["port"] is not None:
        from . import prometheus
        port = settings["port"] + local_rank if settings["port"] else 0
        _server = prometheus.serve(rec.metrics, port, settings["addr"])
        rec.metrics_address = _server[0].server_address[:2]
    if settings["otel"]:
        from . import otel
        _otel = otel.register(rec.metrics)
    if settings["torch_ops"]:
        from .torchops import TorchOps
        rec.torch_ops = TorchOps()
    state.REC = rec
    return rec


def left() -> None:
    """The process group was finalized: write what was recorded (it goes on in a next world)."""
    rec = state.REC
    if rec is not None:
        rec.flush(final=True)
    if _otel is not None:
        _otel.flush()


def stop() -> None:
    """Stop recording: write the files, close the endpoint. Runs at exit."""
    global _server, _settings, _otel
    rec, state.REC = state.REC, None
    server, _server = _server, None
    exporter, _otel = _otel, None
    _settings = None
    if rec is not None:
        rec.close()
    if exporter is not None:
        exporter.close()
    if server is not None:
        server[0].shutdown()
        server[0].server_close()


atexit.register(stop)


def enabled() -> bool:
    """Whether this rank records."""
    return state.REC is not None


def flush() -> Optional[str]:
    """Write the trace file and the metrics files now (they are also written at finalize,
    at exit and when the watchdog reports a hang). Returns the trace file's path or None."""
    rec = state.REC
    return rec.flush() if rec is not None else None


def hang_dump(reason: str) -> Optional[str]:
    """A collective is stuck or failed somewhere in the job (the watchdog): write this rank's
    trace and a Flight Recorder dump (flight.py) now, while the process still can."""
    rec = state.REC
    if rec is None or not rec.dir:
        return None
    from . import flight
    rec.instant("hang dump", "comm", {"reason": reason})
    rec.flush(final=True)
    path: Optional[str] = flight.dump(rec, reason)
    return path


def recorded(name: str, cat: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorator for the library's rare, long operations (a checkpoint, an elastic reset):
    a span on the program's track while recording."""
    def wrap(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(fn)
        def inner(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            rec = state.REC
            if rec is None:
                return fn(*args, **kwargs)
            sid = rec.begin(name, cat, None)
            try:
                return fn(*args, **kwargs)
            finally:
                rec.end(sid)
        return inner
    return wrap


def _name(what: str, name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{what} name must be a non-empty string, got {name!r}")
    return name


def _cat(cat: str) -> str:
    if cat not in CATEGORIES:
        raise InvalidArgument(f"unknown span category {cat!r}; valid: {', '.join(CATEGORIES)} (data counts as "
                              "waiting for data and comm as exposed communication in the step breakdown)")
    return cat


def begin(name: str, cat: str = "user", **args: Any) -> int:
    """Start the program's span `name` and return its id for end() (0 when not recording).
    A span may end on another thread than it began on (a goroutine's)."""
    rec = state.REC
    if rec is None:
        return 0
    sid: int = rec.begin(_name("span", name), _cat(cat), args or None)
    return sid


def end(span: int) -> None:
    """End the span begin() returned."""
    rec = state.REC
    if rec is None or span == 0:
        return
    try:
        rec.end(span)
    except KeyError:
        raise InvalidArgument(f"span {span!r} is not open (ended already, or never begun)") from None


class _Span:
    __slots__ = ("name", "cat", "args", "id")

    def __init__(self, name: str, cat: str, args: dict[str, Any]) -> None:
        self.name, self.cat, self.args, self.id = name, cat, args, 0

    def __enter__(self) -> "_Span":
        self.id = begin(self.name, self.cat, **self.args)
        return self

    def __exit__(self, kind: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        end(self.id)


class _Nothing:
    def __enter__(self) -> "_Nothing":
        return self

    def __exit__(self, kind: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        return None


_NOTHING = _Nothing()


def span(name: str, cat: str = "user", **args: Any) -> ContextManager[object]:
    """`with span("forward"):` the program's span (a no-op when not recording). `cat` puts its
    time in the step breakdown: data (waiting for data), comm (exposed communication),
    forward, or compute (user, compute and the rest); `args` go into the trace event.

    Example::

        >>> from pybridge import observe
        >>> with observe.span("load", "data", shard=3):   # counts as waiting for data
        ...     batch = list(range(8))
    """
    if state.REC is None:
        return _NOTHING
    return _Span(_name("span", name), _cat(cat), args)


def instant(name: str, cat: str = "user", **args: Any) -> None:
    """Mark a moment on the program's track."""
    rec = state.REC
    if rec is not None:
        rec.instant(_name("instant", name), _cat(cat), args or None)


def scalar(name: str, value: float, step: Optional[int] = None) -> None:
    """Log the program's scalar (loss, accuracy) at `step` (default: the current step):
    into the trace (a counter track), the metrics rows, TensorBoard and Prometheus."""
    rec = state.REC
    if rec is None:
        return
    _name("scalar", name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InvalidArgument(f"scalar {name!r}: expected a number, got {value!r}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise InvalidArgument(f"scalar {name!r}: step must be an integer >= 0, got {step!r}")
    rec.scalar(name, float(value), step)


def step() -> int:
    """End the current step (from then on only these calls end steps; without them, each
    reducer iteration is a step). Returns the number of steps ended."""
    rec = state.REC
    if rec is None:
        return 0
    rec.end_step(True)
    return rec.steps


__all__ = ["CATEGORIES", "start", "stop", "enabled", "flush", "span", "begin", "end", "instant", "scalar",
           "step", "now_us"]
