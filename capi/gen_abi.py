"""Generate pybridge/abi.py from capi/pybridge.h: the header is the one source of every
ABI constant (status, dtype, op, device, partition, flag and hook codes).

Usage: python capi/gen_abi.py [--check]
  --check  exit 1 (and say which constants differ) when pybridge/abi.py is not what the
           header gives; `make setup` regenerates it and the test suite checks it.
"""

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "pybridge.h")
TARGET = os.path.join(os.path.dirname(HERE), "pybridge", "abi.py")
DEFINE = re.compile(r"^#define (PB_[A-Z0-9_]+) (-?\d+)\b[ \t]*(?:/\*\s*(.*?)\s*(?:\*/)?)?$", re.M)


def constants(header_text):
    """[(name, value, first line of its comment)] for every integer #define PB_* in order."""
    return [(m[1], int(m[2]), (m[3] or "").strip()) for m in DEFINE.finditer(header_text)]


def render(header_text):
    lines = ['"""ABI constants: generated from capi/pybridge.h by capi/gen_abi.py. Do not edit;',
             'change the header and run `make setup` (or python capi/gen_abi.py)."""', ""]
    for name, value, comment in constants(header_text):
        lines.append(f"{name} = {value}" + (f"  # {comment}" if comment else ""))
    return "\n".join(lines) + "\n"


def main(argv):
    with open(HEADER) as f:
        want = render(f.read())
    have = open(TARGET).read() if os.path.exists(TARGET) else ""
    if "--check" in argv:
        if have != want:
            old, new = set(have.splitlines()), set(want.splitlines())
            diff = sorted(new - old) + [f"(stale) {line}" for line in sorted(old - new)]
            print("pybridge/abi.py is out of date with capi/pybridge.h; run python capi/gen_abi.py\n  "
                  + "\n  ".join(diff))
            return 1
        return 0
    if have != want:
        with open(TARGET, "w") as f:
            f.write(want)
        print("wrote", TARGET)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
