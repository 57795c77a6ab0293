"""python -m pybridge.launch: the same as pybridge-launch."""

import sys

from .torchrun import main

if __name__ == "__main__":
    sys.exit(main())
