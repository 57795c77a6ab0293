"""python -m pybridge.capi build | check | --cflags | --libs | --pkg-config-path | --go-dir
(the same as pybridge-capi): see pybridge/cbuild/cli.py."""

import sys

from ..cbuild.cli import main

if __name__ == "__main__":
    sys.exit(main())
