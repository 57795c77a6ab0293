"""`make bench`: run every benchmark in bench/ in turn (each prints its table and writes
bench/results/NAME.json). Pass names to run only some: python bench/run.py collectives."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ORDER = ["collectives", "reducer", "recordio", "mnist"]


def main(names):
    available = [n for n in ORDER if os.path.exists(os.path.join(HERE, f"{n}.py"))]
    unknown = [n for n in names if n not in available]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(available)}")
    failed = []
    for name in names or available:
        print(f"\n=== bench/{name}.py ===", flush=True)
        if subprocess.run([sys.executable, os.path.join(HERE, f"{name}.py")]).returncode != 0:
            failed.append(name)
    if failed:
        raise SystemExit(f"benchmarks failed: {', '.join(failed)}")


if __name__ == "__main__":
    main(sys.argv[1:])
