"""C ABI functions for elastic training (capi/pybridge.h, "Elastic state" and "Elastic
training"). Conversion only: the caller's tensors, loader and reducer are bound to a
pybridge.runtime.elastic.State for the length of each call; pybridge.runtime.elastic does the rest."""

import math

from .. import capi
from ..runtime import elastic
from ..runtime.elastic import State
from ..errors import InvalidArgument
from . import handles, live_group, put, text
from .checkpoint import _named, _objects
from .reducer import CReducer


class CState:
    """What a pb_state handle names: a State with nothing bound between calls."""

    def __init__(self):
        self.state = State(step=-1)
        self.committed = False

    def bound(self, n, names, tensors, loader, reducer, fresh=False):
        """The state with the caller's objects bound; `fresh`: a new one holding them as its
        commit (a State commits at construction), for a root that has committed nothing."""
        ld, red = _objects(loader, reducer)
        named = _named(n, names, tensors)
        if fresh:
            self.state = State(tensors=named, loader=ld, reducer=red, step=0)
        else:
            self.state.bind(tensors=named, loader=ld, reducer=red)
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
    before = st.commits
    try:
        st.step = step
        st.commit()  # in an elastic world: PB_ERR_MEMBERSHIP after the copy when joiners wait
    finally:
        c.committed = c.committed or st.commits > before
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
    st = c.bound(n, names, tensors, loader, reducer, fresh=not c.committed and g.rank == root)
    try:
        st.sync(root, group=g)
        c.committed = True
    finally:
        st.bind()
    put(step, st.step)


def pb_elastic_init(backend, store_addr, timeout, out):
    if out == capi.ffi.NULL:
        raise InvalidArgument("out (the pointer to store the group handle in) is NULL")
    if math.isnan(timeout):
        raise InvalidArgument("timeout_seconds is NaN")
    g = elastic.init(backend=text(backend) or "auto", store_addr=text(store_addr) or None,
                     timeout=None if timeout <= 0 else timeout)
    handles.add(g, "pb_group *", out)


def _session(call):
    s = elastic.session()
    if s is None:
        raise InvalidArgument(f"{call}: this process is not in an elastic job (join it with pb_elastic_init)")
    return s


def pb_state_reset(state, n, names, tensors, loader, reducer, group, step):
    c = _state(state)
    _check_step_out(step)
    if group == capi.ffi.NULL:
        raise InvalidArgument("group (the pointer to store the new world's handle in) is NULL")
    s = _session("pb_state_reset")
    st = c.bound(n, names, tensors, loader, reducer, fresh=not c.committed)
    red = None if reducer == capi.ffi.NULL else handles.get(reducer, CReducer, "reducer")
    before, flats = (red.reducer.generation, [b.flat for b in red.reducer.buckets]) if red else (0, [])
    old = s.group
    try:
        st.reset()
        c.committed = True
    finally:
        st.bind()
        if red is not None and red.reducer.generation != before:
            red.retired.extend(flats)  # C may still hold pointers into the old layout
        if s.group is not old and not s.group.closed:
            # On the new world (even if the rollback then failed): the caller must be able to leave it.
            handles.add(s.group, "pb_group *", group, "group")
    put(step, st.step)


def pb_elastic_finish(group):
    g = live_group(group)
    s = _session("pb_elastic_finish")
    if g is not s.group:
        raise InvalidArgument("pb_elastic_finish takes the elastic world's group (pb_elastic_init, pb_state_reset)")
    s.membership.finish()


def pb_elastic_last_change(lost, cap, n_lost, joined, old_size, new_size, generation):
    s = _session("pb_elastic_last_change")
    if cap < 0:
        raise InvalidArgument(f"cap must be >= 0, got {cap}")
    if cap > 0 and lost == capi.ffi.NULL:
        raise InvalidArgument(f"lost is NULL with cap = {cap}")
    err, w = s.last_change, s.world
    ranks = err.lost if err is not None else []
    for i, r in enumerate(ranks[:cap]):
        lost[i] = r
    for out, value in ((n_lost, len(ranks)), (joined, err.joined if err else 0),
                       (old_size, err.old_size if err else w.size), (new_size, err.new_size if err else w.size),
                       (generation, err.generation if err else w.generation)):
        if out != capi.ffi.NULL:
            out[0] = value


def pb_state_close(state):
    handles.remove(state, CState, "state")
