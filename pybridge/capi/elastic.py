"""C ABI functions for the elastic state (capi/pybridge.h, "Elastic state"). Conversion only:
the caller's tensors, loader and reducer are bound to a pybridge.elastic.State for the
length of each call."""

from .. import capi
from ..elastic import State
from ..errors import InvalidArgument
from . import handles, live_group, put
from .checkpoint import _named, _objects


class CState:
    """What a pb_state handle names: a State with nothing bound between calls."""

    def __init__(self):
        self.state = State(step=-1)
        self.committed = False

    def bound(self, n, names, tensors, loader, reducer):
        ld, red = _objects(loader, reducer)
        self.state.bind(tensors=_named(n, names, tensors), loader=ld, reducer=red)
        return self.state


def _state(ptr):
    return handles.get(ptr, CState, "state")


def _check_step_out(step):
    if step == capi.ffi.NULL:
        raise InvalidArgument("step (the pointer to store the step in) is NULL")


def pb_state_create(out):
    handles.add(CState(), "pb_state *", out)


def pb_state_commit(state, step, n, names, tensors, loader, reducer):
    c = _state(state)
    if step < 0:
        raise InvalidArgument(f"step must be >= 0, got {step}")
    st = c.bound(n, names, tensors, loader, reducer)
    try:
        st.step = step
        st.commit()
        c.committed = True
    finally:
        st.bind()


def pb_state_restore(state, n, names, tensors, loader, reducer, step):
    c = _state(state)
    _check_step_out(step)
    if not c.committed:
        raise InvalidArgument("nothing was committed to this state yet (pb_state_commit)")
    st = c.bound(n, names, tensors, loader, reducer)
    try:
        st.restore()
    finally:
        st.bind()
    put(step, st.step)


def pb_state_sync(state, group, root, n, names, tensors, loader, reducer, step):
    c = _state(state)
    _check_step_out(step)
    g = live_group(group)
    st = c.bound(n, names, tensors, loader, reducer)
    try:
        st.sync(root, group=g)
        c.committed = True
    finally:
        st.bind()
    put(step, st.step)


def pb_state_close(state):
    handles.remove(state, CState, "state")
