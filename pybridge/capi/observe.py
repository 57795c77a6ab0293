"""C ABI functions for observability (pybridge.observe): start recording, the program's spans,
instants, scalars and steps. Conversion only: what is recorded, and the checks of names and
categories, live in the core."""

from .. import capi, observe
from ..errors import InvalidArgument
from . import put, text


def _name(name):
    if name == capi.ffi.NULL:
        raise InvalidArgument("name is NULL")
    return text(name)


def _category(category):
    return "user" if category == capi.ffi.NULL else text(category)


def pb_observe_start(trace_dir, metrics_port):
    trace = text(trace_dir) or None
    port = None if metrics_port < 0 else metrics_port
    if trace is None and port is None:
        raise InvalidArgument("nothing to record into: trace_dir is NULL or empty and metrics_port < 0; "
                              "give a trace directory, a metrics port (0: any free port) or both")
    observe.start(trace, metrics_port=port)


def pb_observe_enabled(out):
    put(out, int(observe.enabled()))


def pb_observe_flush():
    observe.flush()


def pb_span_begin(name, category, out_span):
    if out_span == capi.ffi.NULL:
        raise InvalidArgument("out_span (the pointer to store the span's id in) is NULL")
    out_span[0] = observe.begin(_name(name), _category(category))


def pb_span_end(span):
    observe.end(span)


def pb_instant(name, category):
    observe.instant(_name(name), _category(category))


def pb_log_scalar(name, value, step):
    observe.scalar(_name(name), value, None if step < 0 else step)


def pb_step_end(out_steps):
    steps = observe.step()
    if out_steps != capi.ffi.NULL:
        out_steps[0] = steps
