"""python -m pybridge.capi build | check | --cflags | --libs | --pkg-config-path | --go-dir
(the same as pybridge-capi): see pybridge/_capi_build.py."""

import sys

from .._capi_build import main

if __name__ == "__main__":
    sys.exit(main())
