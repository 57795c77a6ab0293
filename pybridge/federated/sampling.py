"""Seeded client sampling: which k of n clients train in a round, the same for a given
(seed, round) on every run, machine and front end (C and Go call this function)."""

import random

from ..base.checks import integer


def sample_clients(num_clients: int, per_round: int, seed: int, round: int) -> list[int]:
    """`per_round` distinct client ids of range(num_clients), sorted, drawn for `round` of a
    run seeded `seed`: reproducible from (seed, round) alone, so a resumed run draws the
    rounds it has not done yet exactly as an uninterrupted one would."""
    n = integer("num_clients", num_clients, low=1)
    k = integer("per_round", per_round, low=1, high=n,
                expected=f"an integer in [1, num_clients = {n}]")
    seed = integer("seed", seed)
    r = integer("round", round, low=0)
    # a string seed goes through SHA-512 in random.seed: independent streams per (seed, round)
    return sorted(random.Random(f"pybridge.federated/{seed}/{r}").sample(range(n), k))
