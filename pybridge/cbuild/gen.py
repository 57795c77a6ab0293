"""Code generated from capi/pybridge.h: the one parser of the header, and the C text of
libpybridge.so built from it.

The header is the one source of the ABI. This module reads its constants and its
`int pb_NAME(...)` prototypes and writes what cffi compiles: the declarations (cdef), a
C wrapper per function over an `extern "Python"` implementation, and the C runtime
(runtime.c) with the build's values filled in. capi/gen_abi.py uses the same
parser for pybridge/abi.py and the Go trampolines (go/pbgo_gen.h).

It imports nothing from the package (the tests and capi/gen_abi.py load this file on its
own: importing pybridge would import torch and decide which core a library finds).
"""

import os
import re

RUNTIME = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime.c")
PURE_C = {"pb_last_error", "pb_status_name", "pb_version"}  # implemented in runtime.c
PROTO = re.compile(r"^int (pb_\w+)\(([^;]*?)\);", re.M | re.S)
DEFINE = re.compile(r"^#define (PB_[A-Z0-9_]+) (-?\d+)\b[ \t]*(?:/\*\s*(.*?)\s*(?:\*/)?)?$", re.M)


def constants(header_text):
    """[(name, value, first line of its comment)] for every integer #define PB_* in order."""
    return [(m[1], int(m[2]), (m[3] or "").strip()) for m in DEFINE.finditer(header_text)]


def prototypes(header_text):
    """(name, argument list) of every int-returning function in the header."""
    for name, args in PROTO.findall(header_text):
        yield name, " ".join(args.split())


def arg_names(args):
    """The parameter names of an argument list, comma-separated: what a call passes on
    (none for `void`)."""
    if args.strip() in ("", "void"):
        return ""
    return ", ".join(re.findall(r"(\w+)\s*(?:,|$)", args))


def declarations(header_text):
    """The header's constants and types, in the subset of C that cffi's cdef parses."""
    lines = [f"#define {name} {value}" for name, value, _ in constants(header_text)]
    code = re.sub(r"/\*.*?\*/", "", header_text, flags=re.S)
    lines += re.findall(r"^typedef struct[^;]*?(?:\{[^}]*\}[^;]*)?;", code, re.M | re.S)
    return lines


def public_cdef(header_text):
    """cdef text for loading libpybridge.so with cffi in ABI mode (ffi.dlopen)."""
    lines = declarations(header_text)
    lines += ["const char *pb_last_error(void);", "const char *pb_status_name(int status);",
              "const char *pb_version(void);"]
    lines += [f"int {name}({args});" for name, args in prototypes(header_text) if name not in PURE_C]
    return "\n".join(lines)


def cdef_text(header_text):
    """The build's cdef: constants, types, and the extern "Python" implementations."""
    lines = declarations(header_text)
    lines.append("""
void _pb_set_error(const char *msg);
void _pb_set_ready(void);
void _pb_set_start_error(const char *msg);
int _pb_python_started_here(void);
""")
    for name, args in prototypes(header_text):
        if name not in PURE_C:
            lines.append(f'extern "Python" int _pb_py_{name[3:]}({args});')
    return "\n".join(lines)


def status_cases(header_text):
    """pb_status_name's cases, from the header's status codes (PB_OK and PB_ERR_*)."""
    names = [n for n, _, _ in constants(header_text) if n == "PB_OK" or n.startswith("PB_ERR_")]
    return "\n".join(f'    case {n}: return "{n}";' for n in names)


def wrappers(header_text):
    """The exported C function of every prototype: a call into its Python implementation
    that turns "the core never started" into PB_ERR_INTERNAL (cffi would return 0)."""
    out = []
    for name, args in prototypes(header_text):
        if name in PURE_C:
            continue
        out.append(f"static int _pb_py_{name[3:]}({args});\n"
                   f"CFFI_DLLEXPORT int {name}({args}) {{\n"
                   f"    if (pb_core_failed || !pb_python_ready())\n        return pb_not_ready();\n"
                   f"    int rc = _pb_py_{name[3:]}({arg_names(args)});\n"
                   f"    if (!pb_core_ready)\n        pb_core_failed = 1;\n"
                   f"    return pb_core_ready ? rc : pb_not_ready();\n}}\n")
    return "\n".join(out)


def c_source(header_text, version, python):
    """The library's C source: the runtime for this build, then the generated wrappers."""
    with open(RUNTIME) as f:
        runtime = f.read()
    return (runtime.replace("@VERSION@", version).replace("@PYTHON@", python)
            .replace("@STATUS_CASES@", status_cases(header_text)) + wrappers(header_text))


# Run by the embedded interpreter when the library is first called (cffi's
# embedding_init_code); @CONFIG@ is the build's paths as a JSON string (init_code).
INIT_CODE = r"""
import json, os, site, sys

from _pybridge_capi import ffi, lib

_cfg = json.loads(@CONFIG@)
if lib._pb_python_started_here():
    # The embedded interpreter starts with the base installation's paths only: put any
    # PYBRIDGE_PYTHONPATH override and the checkout this library was built from (if any) first,
    # then add the build environment's (a virtual environment's site-packages, editable
    # installs), before importing the core.
    _extra = [p for p in os.environ.get("PYBRIDGE_PYTHONPATH", "").split(os.pathsep) if p]
    for _p in reversed(_extra + ([_cfg["pybridge_root"]] if _cfg["pybridge_root"] else [])):
        sys.path.insert(0, _p)
    for _p in _cfg["sys_path"]:
        if _p not in sys.path:
            sys.path.append(_p)
    for _d in _cfg["site_dirs"]:
        if os.path.isdir(_d):
            site.addsitedir(_d)  # processes .pth files, which editable installs rely on
    # multiprocessing's spawn (used by DataLoader workers) re-runs sys.executable: point
    # it at a real interpreter, not at the host program.
    sys.executable = os.environ.get("PYBRIDGE_PYTHON") or _cfg["python"]
    if not sys.argv:
        sys.argv = [""]
elif os.environ.get("PYBRIDGE_PYTHONPATH"):
    # Loaded into a running Python: leave its paths and executable alone, but honour
    # an explicit override.
    sys.path[:0] = [p for p in os.environ["PYBRIDGE_PYTHONPATH"].split(os.pathsep) if p]

try:
    import pybridge.capi
    pybridge.capi.install(ffi, lib)
except BaseException as _exc:
    import traceback
    traceback.print_exc()
    lib._pb_set_start_error(("%s: %s (sys.path=%s)" % (
        type(_exc).__name__, _exc, sys.path)).encode()[:3000])
    raise
lib._pb_set_ready()
"""


def init_code(config_json):
    """The embedded interpreter's start-up code for a build whose paths are config_json."""
    return INIT_CODE.replace("@CONFIG@", repr(config_json))
