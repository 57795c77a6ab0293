"""Who may import and call whom in the core: the seams issue 20 drew, kept from drifting."""

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pybridge")


def _imports(name, anywhere=False):
    """Modules `name` imports: when it is imported (top-level statements), or `anywhere`
    (also inside functions, which import only when called)."""
    tree = ast.parse(open(os.path.join(ROOT, name)).read())
    found = set()
    for node in ast.walk(tree) if anywhere else tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _source(name):
    return open(os.path.join(ROOT, name)).read()


def test_group_sits_below_the_collectives():
    # group.py builds groups; split/node_groups (which need a collective) live in subgroups.py
    assert "collectives" not in _imports("group.py", anywhere=True)
    assert "subgroups" not in _imports("group.py")  # only pybridge.group.split's deprecated redirect
    assert {"collectives", "group"} <= _imports("subgroups.py")


def test_checked_mode_issues_no_collective_itself():
    # its allreduce and all_gather run in collectives.py (_verify), like every other one
    assert "torch.distributed" not in _imports("checked.py")
    assert ".pg." not in _source("checked.py")


def test_group_state_has_owners():
    # only the watchdog's Progress and checked mode's State hold this state now
    for name in ("collectives.py", "checked.py", "watchdog.py", "gossip.py", "subgroups.py", "hierarchical.py",
                 "local_sgd.py", "hook_thread.py"):
        text = _source(name)
        for private in ("._children", "._world_store", ".issued =", ".inflight", ".fingerprint_buffer"):
            assert private not in text, (name, private)


def test_the_shuffle_belongs_to_neither_user():
    assert "shuffle" in _imports("gossip_schedule.py")
    assert "recordio.partition" not in _imports("gossip_schedule.py")


def test_progress_is_changed_only_through_its_methods():
    import pytest
    from pybridge.watchdog import Progress
    world = Progress()
    assert not world.watched and world.begin("op") == 1 and world.first_unfinished() == (None, None)
    world._watch()  # what watchdog.start does
    child = Progress(world)
    assert child.watched
    seq = child.begin("all_reduce")
    assert seq == 1 and child.first_unfinished()[0] == 1
    child.end(seq)
    assert child.first_unfinished() == (None, None) and child.issued == 1
    with pytest.raises(AttributeError):
        child.issued = 5


def test_old_names_still_work_with_a_warning():
    import warnings

    import pytest

    import pybridge
    from pybridge import group, subgroups
    with pytest.warns(DeprecationWarning, match="use pybridge.split"):
        assert group.split is subgroups.split is pybridge.split
    with pytest.warns(DeprecationWarning, match="use pybridge.node_groups"):
        assert group.node_groups is pybridge.node_groups
    g = group.Group(None, [0], 0, 0, "gloo", 5.0, owned=True)
    assert g.split.__func__ is pybridge.Group.split and g.children == () and g.issued == 0
    for name in ("inflight", "fingerprint_buffer", "p2p"):
        with pytest.warns(DeprecationWarning, match=f"Group.{name} is deprecated"):
            getattr(g, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g.checks is None and g.progress.issued == 0
