"""A rank that reduces in a loop until a peer is lost (tests/test_cluster.py kills a whole
node): prints READY once the group works, then the error it got, as `LOST <type>: <message>`."""

import sys
import time

import torch

import pybridge

g = pybridge.init(timeout=20)
x = torch.ones(1000)
pybridge.all_reduce(x)
print("READY", flush=True)
try:
    for _ in range(100000):
        pybridge.all_reduce(x)
        time.sleep(0.01)
except pybridge.PyBridgeError as exc:
    print(f"LOST {type(exc).__name__}: {exc}", flush=True)
    sys.exit(3)
