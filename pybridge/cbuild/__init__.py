"""Building the C library: the header parser and code generators (gen), the compile step
and pybridge.pc (library), the pybridge-capi command (cli), and the hand-written C runtime
(runtime.c). Imports no torch and no other layer: it builds the ABI, capi implements it."""
