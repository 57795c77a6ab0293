"""Generate the files derived from capi/pybridge.h, the one source of the ABI:

  pybridge/abi.py   every integer #define PB_* (status, dtype, op, device, partition, flag
                    and hook codes), for Python
  go/pbgo_gen.h     a trampoline per `int pb_NAME(...)`: pbgo_NAME(same arguments, char **msg)
                    makes the call and copies the error message in the same cgo call
  go/names_gen.go   goConstants: the Go name of each C constant an exported Go constant
                    stands for (`HookFP16 Hook = C.PB_HOOK_FP16`), read from go/*.go, for
                    the C names in library messages (goWords, go/errors.go)

All are committed (the Go module must build without Python); the header is parsed by
pybridge/cbuild/gen.py, as for the library itself.

Usage: python capi/gen_abi.py [--check]
  --check  exit 1 (and say what differs) when a generated file is not what the header
           gives; `make setup` regenerates them and the test suite checks them.
"""

import importlib.util
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HEADER = os.path.join(HERE, "pybridge.h")
TARGET = os.path.join(ROOT, "pybridge", "abi.py")
GO_TARGET = os.path.join(ROOT, "go", "pbgo_gen.h")
GO_NAMES_TARGET = os.path.join(ROOT, "go", "names_gen.go")

# The parser on its own, not through the package (which would import torch).
_spec = importlib.util.spec_from_file_location("_pb_capi_gen", os.path.join(ROOT, "pybridge", "cbuild", "gen.py"))
_capi_gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_capi_gen)
constants = _capi_gen.constants


def render(header_text):
    """pybridge/abi.py."""
    lines = ['"""ABI constants: generated from capi/pybridge.h by capi/gen_abi.py. Do not edit;',
             'change the header and run `make setup` (or python capi/gen_abi.py)."""', ""]
    for name, value, comment in constants(header_text):
        lines.append(f"{name} = {value}" + (f"  # {comment}" if comment else ""))
    return "\n".join(lines) + "\n"


def _wrapped(head, params, tail, indent="", width=100):
    """indent + head + params joined by ", " + tail, broken after commas past `width`
    columns (a tab indent counting 8) and continued under the first parameter, as
    pbgo.h's hand-written helpers are."""
    if not params:
        return indent + head + tail
    margin = 8 * indent.count("\t") + len(indent.replace("\t", ""))
    lines, line = [], head
    for i, p in enumerate(params):
        piece = p + ("," if i < len(params) - 1 else tail)
        if line != head and margin + len(line) + 1 + len(piece) > width:
            lines.append(indent + line)
            line = " " * len(head) + piece
        else:
            line += ("" if line == head else " ") + piece
    return "\n".join(lines + [indent + line])


def render_go(header_text):
    """go/pbgo_gen.h."""
    out = ["/* Generated from capi/pybridge.h by capi/gen_abi.py. Do not edit; change the header and",
           " * run `make setup` (or python capi/gen_abi.py).",
           " *",
           " * pbgo_NAME(arguments of pb_NAME, char **msg) calls pb_NAME and, when it fails, stores a",
           " * malloc'd copy of pb_last_error() in *msg (may be NULL) in the same cgo call: the message",
           " * is thread-local and a goroutine may move to another OS thread between two cgo calls.",
           " * Included by pbgo.h, which defines pbgo_status. */",
           "#ifndef PBGO_GEN_H", "#define PBGO_GEN_H", ""]
    for name, args in _capi_gen.prototypes(header_text):
        params = [] if args in ("", "void") else [a.strip() for a in args.split(",")]
        names = _capi_gen.arg_names(args).split(", ") if params else []
        out.append(_wrapped(f"static inline int pbgo_{name[3:]}(", params + ["char **msg"], ") {"))
        out.append(_wrapped(f"return pbgo_status({name}(", names, "), msg);", indent="\t") + "\n}\n")
    out.append("#endif /* PBGO_GEN_H */")
    return "\n".join(out) + "\n"


# An exported Go constant that is a C constant, typed or not: `HookFP16 Hook = C.PB_HOOK_FP16`,
# `const CPU = C.PB_CPU`.
GO_CONSTANT = re.compile(r"^\s*(?:const\s+)?([A-Z]\w*)(?:\s+[A-Z]\w*)?\s*=\s*C\.(PB_\w+)\b", re.M)


def go_constants(go_dir=None):
    """{C constant: the exported Go constant defined as it} over the package's Go files (the
    tests and this generator's own output aside)."""
    go_dir = go_dir or os.path.dirname(GO_NAMES_TARGET)
    found = {}
    for name in sorted(os.listdir(go_dir)):
        path = os.path.join(go_dir, name)
        if name.endswith(".go") and not name.endswith("_test.go") and path != GO_NAMES_TARGET:
            with open(path) as f:
                for go, c in GO_CONSTANT.findall(f.read()):
                    if found.setdefault(c, go) != go:
                        raise SystemExit(f"{name}: {go} and {found[c]} both stand for C.{c}")
    return found


def render_go_names(constants_by_c):
    """go/names_gen.go (gofmt's layout: values aligned after the longest key)."""
    keys = sorted(constants_by_c)
    width = max(len(f'"{k}":') for k in keys)
    out = ["// Code generated by capi/gen_abi.py from go/*.go; DO NOT EDIT.", "",
           "package pybridge", "",
           "// goConstants: the C constants that exported Go constants stand for, and their Go",
           "// names, for the C names in library messages (goWords). A Go constant written as",
           "// `Name Type = C.PB_NAME` is here after `make setup`; other C names are in goNames.",
           "var goConstants = map[string]string{"]
    out += [f'\t{(chr(34) + k + chr(34) + ":").ljust(width)} "{constants_by_c[k]}",' for k in keys]
    return "\n".join(out + ["}"]) + "\n"


def main(argv):
    with open(HEADER) as f:
        header = f.read()
    stale = []
    for target, want in ((TARGET, render(header)), (GO_TARGET, render_go(header)),
                         (GO_NAMES_TARGET, render_go_names(go_constants()))):
        have = open(target).read() if os.path.exists(target) else ""
        if have == want:
            continue
        rel = os.path.relpath(target, ROOT)
        if "--check" in argv:
            old, new = set(have.splitlines()), set(want.splitlines())
            diff = sorted(new - old) + [f"(stale) {line}" for line in sorted(old - new)]
            source = "go/*.go" if target == GO_NAMES_TARGET else "capi/pybridge.h"
            stale.append(f"{rel} is out of date with {source}; run python capi/gen_abi.py\n  "
                         + "\n  ".join(diff))
        else:
            with open(target, "w") as f:
                f.write(want)
            print("wrote", target)
    if stale:
        print("\n".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
