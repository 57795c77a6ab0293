"""Build build/libpybridge.so and build/pybridge.pc for this checkout (what `make` runs).

Usage: python capi/build.py [--out DIR]

The build code is pybridge/cbuild/library.py (also behind `python -m pybridge.capi build` for
an installed package); here the library embeds this checkout's pybridge first, whatever an
editable install points at, and pybridge.pc points at capi/ for the header.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

# Importing pybridge (and so torch) here also checks that the build environment can run the core.
from pybridge.cbuild.library import build_checkout  # noqa: E402

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO, "build"))
    print(f"built {build_checkout(parser.parse_args().out, HERE, exclude=(HERE, REPO))}")
