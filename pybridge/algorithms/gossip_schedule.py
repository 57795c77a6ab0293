"""GossipGraD's peer schedule: which node each node sends to and receives from at a step.

Pure functions, no processes: the same answer on every rank, and a schedule a user can print.

Nodes sit at positions 0..N-1 of a virtual topology, a permutation of the nodes. For step s,
period = max(1, ceil(log2 N)) and power = s % period:
  cube:          send to and receive from position i XOR 2^power (no exchange when that
                 position is >= N, which happens only when N is not a power of two);
  dissemination: send to position (i + 2^power) mod N, receive from (i - 2^power) mod N.
With a fixed topology, ceil(log2 N) steps mix every node's value into every other node
(exactly the mean for N a power of two). Rotation redraws the topology at the start of
each period, from (seed, period index) alone, with pybridge.base.shuffle (the splitmix64
Fisher-Yates shuffle the RecordIO partitioner uses too): no global random state is read or changed.
"""

from typing import Optional

from ..base.checks import index, integer
from ..errors import InvalidArgument
from ..base.shuffle import permutation

CUBE = "cube"
DISSEMINATION = "dissemination"
TOPOLOGIES = (CUBE, DISSEMINATION)


_Pair = tuple[Optional[int], Optional[int]]


def check_topology(topology: str) -> str:
    """The topology's name, checked ('cube' or 'dissemination', any case)."""
    name = topology.lower() if isinstance(topology, str) else topology
    if name not in TOPOLOGIES:
        raise InvalidArgument(f"unknown gossip topology {topology!r}; choose 'cube' or 'dissemination'")
    checked: str = name
    return checked


def period(num_nodes: int) -> int:
    """Steps per period: max(1, ceil(log2 N)); the power of two cycles through 0..period-1."""
    return max(1, (integer("number of nodes", num_nodes, low=1) - 1).bit_length())


def virtual_topology(num_nodes: int, seed: int, step: int, rotate: bool = True) -> list[int]:
    """The node at each position for `step`: redrawn every period when rotating, else identity."""
    if not rotate or num_nodes == 1:
        return list(range(num_nodes))
    return permutation(num_nodes, integer("seed", seed, low=0), step // period(num_nodes))


def peers(topology: str, num_nodes: int, seed: int, step: int, node: int, rotate: bool = True) -> _Pair:
    """(send_to, receive_from) node numbers for `node` at `step`; (None, None) when the node
    sits out this step (a single node, or cube's unmatched position)."""
    topology = check_topology(topology)
    n = integer("number of nodes", num_nodes, low=1)
    step = integer("step", step, low=0)
    node = index("node", node, n, f"{n} nodes")
    if n == 1:
        return None, None
    order = virtual_topology(n, seed, step, rotate)
    pos = order.index(node)
    hop = 1 << (step % period(n))
    if topology == CUBE:
        partner = pos ^ hop
        if partner >= n:
            return None, None
        return order[partner], order[partner]
    return order[(pos + hop) % n], order[(pos - hop) % n]


def schedule(topology: str, num_nodes: int, seed: int, steps: int,
             rotate: bool = True) -> list[tuple[int, list[_Pair]]]:
    """[(step, [(send_to, receive_from) for each node])] for steps 0..steps-1: for reading."""
    return [(s, [peers(topology, num_nodes, seed, s, i, rotate) for i in range(num_nodes)])
            for s in range(steps)]


__all__ = ["CUBE", "DISSEMINATION", "TOPOLOGIES", "period", "virtual_topology", "peers", "schedule"]
