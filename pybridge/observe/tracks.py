"""The tracks (Chrome's `tid`) of a rank's trace: what the recorder writes and the report
reads. Collectives get one track per process group from FIRST_COLLECTIVES on; libtorch's
operations (torchops.py) one per thread from 1000."""

PROGRAM, STEPS, BUCKETS, BACKWARD = 1, 2, 3, 4
FIRST_COLLECTIVES = 10
FIRST_LIBTORCH = 1000
NAMES = {PROGRAM: "program", STEPS: "steps", BUCKETS: "buckets (reducer)", BACKWARD: "backward"}
