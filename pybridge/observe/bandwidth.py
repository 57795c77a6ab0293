"""Algorithm and bus bandwidth of a collective, as nccl-tests defines them
(nccl-tests/doc/PERFORMANCE.md): algbw = bytes / time; busbw = algbw x a factor that makes
the figure comparable to the link's peak whatever the algorithm and rank count."""


def bus_factor(op, ranks):
    """The busbw/algbw factor of collective `op` (its pybridge name) on `ranks` ranks."""
    n = max(int(ranks), 1)
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    return 0.0  # barrier and the like move no payload


def algbw(nbytes, seconds):
    """Bytes per second (0 when no time was measured)."""
    return nbytes / seconds if seconds > 0 else 0.0


def busbw(op, nbytes, seconds, ranks):
    return algbw(nbytes, seconds) * bus_factor(op, ranks)


def size_bin(nbytes):
    """The power of two at or above `nbytes` (1 for 0): the message-size class of the
    bandwidth-against-size tables."""
    return 1 << max(int(nbytes) - 1, 0).bit_length()
