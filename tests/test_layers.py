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
    for name in ("collectives.py", "checked.py", "watchdog.py", "gossip.py", "subgroups.py"):
        text = _source(name)
        for private in ("._children", "._world_store", ".issued =", ".inflight", ".fingerprint_buffer"):
            assert private not in text, (name, private)


def test_the_shuffle_belongs_to_neither_user():
    assert "shuffle" in _imports("gossip_schedule.py")
    assert "recordio.partition" not in _imports("gossip_schedule.py")
