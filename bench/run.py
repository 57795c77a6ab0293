"""`make bench`: run every benchmark in bench/ in turn (each prints its table and writes
bench/results/NAME.json). Pass names to run only some: python bench/run.py collectives."""

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(HERE := os.path.dirname(os.path.abspath(__file__))))
from pybridge._version import __version__  # noqa: E402

ORDER = ["collectives", "reducer", "gossip", "hierarchical", "diloco_wire", "recordio", "mnist", "gotorch", "federated", "failures",
         "elastic", "elastic_cgo", "gpu"]


def main(argv):
    available = [n for n in ORDER if os.path.exists(os.path.join(HERE, f"{n}.py"))]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run (default all: {', '.join(available)})")
    p.add_argument("--version", action="version", version=f"%(prog)s (pybridge {__version__})")
    names = p.parse_args(argv).names
    unknown = [n for n in names if n not in available]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(available)}")
    failed = []
    for name in names or available:
        print(f"\n=== bench/{name}.py ===", flush=True)
        if subprocess.run([sys.executable, os.path.join(HERE, f"{name}.py")]).returncode != 0:
            failed.append(name)
    if failed:
        raise SystemExit(f"benchmarks failed: {', '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
