"""The base layer: argument checks, dtypes, zero-copy buffers, DLPack structs, network
interfaces, progress output and the one deterministic shuffle. Imports only pybridge.errors
and pybridge.abi (and torch, numpy); every other layer may import it."""
