"""python -m pybridge.capi build | --cflags | --libs | --pkg-config-path: see pybridge/_capi_build.py."""

import sys

from .._capi_build import main

if __name__ == "__main__":
    sys.exit(main())
