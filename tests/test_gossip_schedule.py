"""GossipGraD's peer schedule, without processes: symmetry, matching, determinism, mixing."""

import random

import numpy as np
import pytest

from pybridge.algorithms import gossip_schedule as gs
from pybridge.errors import InvalidArgument

SIZES = range(1, 18)


@pytest.mark.parametrize("rotate", [True, False])
def test_cube_is_symmetric(rotate):
    for n in SIZES:
        for step in range(3 * gs.period(n)):
            pairs = [gs.peers("cube", n, 5, step, i, rotate) for i in range(n)]
            for i, (send, recv) in enumerate(pairs):
                assert send == recv
                if send is not None:
                    assert send != i and pairs[send] == (i, i), (n, step, i)
            if n & (n - 1) == 0 and n > 1:  # a power of two: everyone is matched
                assert all(p != (None, None) for p in pairs)


@pytest.mark.parametrize("rotate", [True, False])
def test_dissemination_sends_match_receives(rotate):
    for n in SIZES:
        for step in range(3 * gs.period(n)):
            pairs = [gs.peers("dissemination", n, 5, step, i, rotate) for i in range(n)]
            if n == 1:
                assert pairs == [(None, None)]
                continue
            assert sorted(s for s, _ in pairs) == list(range(n))  # a permutation: one message each
            for i, (send, _) in enumerate(pairs):
                assert send != i and pairs[send][1] == i, (n, step, i)


def test_deterministic_and_leaves_global_random_alone():
    state = random.getstate()
    a = gs.schedule("cube", 13, 42, 20)
    random.seed(1)  # global state must not matter either
    assert gs.schedule("cube", 13, 42, 20) == a
    random.setstate(state)
    b = gs.schedule("cube", 13, 42, 20)
    assert random.getstate() == state and a == b
    assert gs.schedule("cube", 13, 43, 20) != a  # the seed matters


def test_topology_is_redrawn_each_period_and_constant_within_one():
    n, p = 8, gs.period(8)
    assert p == 3
    tops = [gs.virtual_topology(n, 7, s) for s in range(4 * p)]
    for k in range(4):
        assert all(t == tops[k * p] for t in tops[k * p:(k + 1) * p])
        assert sorted(tops[k * p]) == list(range(n))
    assert len({tuple(tops[k * p]) for k in range(4)}) > 1
    assert gs.virtual_topology(n, 7, 5, rotate=False) == list(range(n))


def _simulate(topology, n, steps, seed=0, rotate=False):
    x = np.arange(n, dtype=np.float64)  # value = node number
    devs = []
    for s in range(steps):
        nxt = x.copy()
        for i in range(n):
            send, recv = gs.peers(topology, n, seed, s, i, rotate)
            if recv is not None:
                nxt[i] = (x[i] + x[recv]) * 0.5
        x = nxt
        devs.append(np.abs(x - (n - 1) / 2).max())
    return x, devs


@pytest.mark.parametrize("topology", gs.TOPOLOGIES)
@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_mixes_to_the_mean_in_log2_steps(topology, n):
    x, _ = _simulate(topology, n, gs.period(n))
    np.testing.assert_allclose(x, (n - 1) / 2, atol=1e-12)


@pytest.mark.parametrize("topology", gs.TOPOLOGIES)
def test_six_nodes_deviation_shrinks_every_period(topology):
    p = gs.period(6)
    _, devs = _simulate(topology, 6, 6 * p, seed=3, rotate=True)
    ends = [2.5] + devs[p - 1::p]  # the deviation at the start, then after each period
    # Measured (seed 3): every period cuts the largest deviation from the mean by 4x or more
    # (cube 2.5, 0.25, 0.031, 0.0039, ...; dissemination 2.5, 0.5, 0.094, 0.0078, ...).
    assert all(b <= a / 3 for a, b in zip(ends, ends[1:])), ends


def test_bad_arguments():
    for args in [("ring", 4, 0, 0, 0), ("cube", 0, 0, 0, 0), ("cube", 4, 0, -1, 0), ("cube", 4, 0, 0, 4),
                 ("cube", 4, -1, 0, 0), ("cube", 4, 0, 0, True)]:
        with pytest.raises(InvalidArgument):
            gs.peers(*args)
