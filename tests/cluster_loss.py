"""A rank that reduces in a loop until a peer is lost (tests/test_cluster.py kills a whole
node): prints READY once the group works; the error then ends it, uncaught, as in a
training script, so its launcher shows it."""

import os
import time

import torch

import pybridge

g = pybridge.init(timeout=20)
x = torch.ones(1000)
pybridge.all_reduce(x)
os.write(1, b"READY\n")  # one write: print() under the launcher's -u writes "READY" and "\n" apart (CI read "READYREADY")
for _ in range(100000):
    pybridge.all_reduce(x)
    time.sleep(0.01)
