"""The one shuffle pybridge uses wherever every rank must derive the same order without
talking: RecordIO's epoch order (recordio.partition) and gossip's virtual topology
(gossip_schedule).

A Fisher-Yates shuffle driven by splitmix64, seeded from (seed, epoch). It is spelled out
here (not numpy's generator, whose streams may change between versions) so that every
rank, and any other implementation, derives the same order.
"""

from .checks import integer

_MASK64 = (1 << 64) - 1


def splitmix64(state: int) -> tuple[int, int]:
    """One step of splitmix64: (next state, 64-bit output)."""
    state = (state + 0x9E3779B97F4A7C15) & _MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return state, z ^ (z >> 31)


def permutation(n: int, seed: int, epoch: int) -> list[int]:
    """The shuffle order of n items for (seed, epoch): Fisher-Yates, j = splitmix64() % (i + 1)."""
    seed = integer("seed", seed, low=0)
    epoch = integer("epoch", epoch, low=0)
    state = (seed * 0x9E3779B97F4A7C15 + epoch) & _MASK64
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        state, r = splitmix64(state)
        j = r % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


__all__ = ["permutation", "splitmix64"]
