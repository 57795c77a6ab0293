"""Tools for pybridge's own tests and benchmarks: a simulated cluster of network namespaces."""
