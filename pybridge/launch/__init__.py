"""pybridge-launch: one worker per GPU (or CPU slot) over torchrun's agent, or the
launcher's own supervision for --elastic jobs. `python -m pybridge.launch` and the
`pybridge-launch` command run `main`. Importing it imports no torch."""

from .exits import PROG
from .torchrun import main

__all__ = ["PROG", "main"]
