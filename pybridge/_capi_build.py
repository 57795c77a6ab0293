"""Build libpybridge.so (cffi embedding mode), its header and a pkg-config file.

    python -m pybridge.capi build [--prefix DIR]      (or: pybridge-capi build ...)
    python -m pybridge.capi --cflags | --libs | --pkg-config-path | --go-dir [--prefix DIR]
    python -m pybridge.capi check        (is PKG_CONFIG_PATH right for cgo?)

`build` writes DIR/lib/libpybridge.so, DIR/include/pybridge.h and
DIR/lib/pkgconfig/pybridge.pc. The library embeds the interpreter running this command
and the pybridge package it imports, so run it with the environment's own python
after `pip install pybridge`. DIR defaults to the active virtual environment
(sys.prefix), else to the user base (~/.local). The queries print compiler and linker
flags (or the folder to put on PKG_CONFIG_PATH), like python3-config; --go-dir prints the
folder of the Go module the package ships, for a `replace` directive (no module proxy needed).

In a checkout, `make` (capi/build.py) builds build/libpybridge.so and build/pybridge.pc
from the same code, embedding the checkout's pybridge first.

Each `int pb_NAME(...)` in the header, except the pure-C ones, becomes a thin C
wrapper over an `extern "Python"` function `_pb_py_NAME` implemented in
the pybridge/capi/ package. The wrappers exist for one reason: if the embedded Python core
cannot start, cffi would make every call return 0 (PB_OK); the wrapper turns that
into PB_ERR_INTERNAL with the start-up error as message.
"""

import argparse
import json
import os
import re
import shutil
import site
import sys
import sysconfig
import tempfile

PROG = "pybridge-capi"
PACKAGE = os.path.dirname(os.path.abspath(__file__))
# In a checkout these link to capi/pybridge.h and go/, the one sources; wheels carry copies.
HEADER = os.path.join(PACKAGE, "include", "pybridge.h")
GO_MODULE = os.path.join(PACKAGE, "go")  # github.com/pybridge/pybridge/go, for a `replace` directive
PURE_C = {"pb_last_error", "pb_status_name", "pb_version"}
PROTO = re.compile(r"^int (pb_\w+)\(([^;]*?)\);", re.M | re.S)


def version():
    # Imported here, not at the top: the tests load this file on its own, without the
    # package (which would import the core), to read the header's declarations.
    from ._version import __version__
    return __version__

C_SOURCE = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "pybridge.h"

#define PB_ERRMSG_MAX 4096
static __thread char pb_errmsg[PB_ERRMSG_MAX];
static volatile int pb_core_ready = 0;
static char pb_start_error[PB_ERRMSG_MAX] = "the pybridge Python core failed to start "
    "(see the traceback on stderr)";

/* Called from Python (pybridge/capi/) on the calling thread. */
static void _pb_set_error(const char *msg) {
    snprintf(pb_errmsg, sizeof pb_errmsg, "%s", msg);
}
static void _pb_set_ready(void) { pb_core_ready = 1; }
static void _pb_set_start_error(const char *msg) {
    snprintf(pb_start_error, sizeof pb_start_error, "pybridge core failed to start: %s", msg);
}

static volatile int pb_core_failed = 0;  /* cffi's start-up failed: never re-enter it */

static int pb_not_ready(void) {
    snprintf(pb_errmsg, sizeof pb_errmsg, "%s", pb_start_error);
    return PB_ERR_INTERNAL;
}

/* Start the interpreter ourselves, before cffi would: left to itself, an embedded
 * Python locates its prefix by searching PATH for "python3", which can be another
 * installation, and ignores a virtual environment. Naming the build's interpreter
 * (or $PYBRIDGE_PYTHON) as the executable gives the same sys.prefix and
 * site-packages as running that interpreter. No signal handlers are installed. */
static pthread_once_t pb_python_once = PTHREAD_ONCE_INIT;
static int pb_python_ok = 0;
static int pb_python_ours = 0;  /* we started the interpreter (not loaded into a running one) */

static int _pb_python_started_here(void) { return pb_python_ours; }

/* cffi (< 2.1) serializes its start-up with a spin lock on PyCapsule_Type.tp_version_tag
 * on Python < 3.12 and spins for ever if that tag is already set, which happens once
 * any code has looked up a capsule attribute (importing torch does). Invalidating the
 * tag through the public API (the GIL held) lets cffi's lock proceed. */
static void pb_unblock_cffi_lock(void) {
#if PY_VERSION_HEX < 0x030C0000
    PyType_Modified(&PyCapsule_Type);
#endif
}

static void pb_start_python(void) {
    if (Py_IsInitialized()) {  /* loaded into a running Python */
        PyGILState_STATE gil = PyGILState_Ensure();
        pb_unblock_cffi_lock();
        PyGILState_Release(gil);
        pb_python_ok = 1;
        return;
    }
    const char *exe = getenv("PYBRIDGE_PYTHON");
    if (exe == NULL || exe[0] == '\0')
        exe = "@PYTHON@";
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0;
    config.parse_argv = 0;
    PyStatus status = PyConfig_SetBytesString(&config, &config.executable, exe);
    if (!PyStatus_Exception(status))
        status = PyConfig_SetBytesString(&config, &config.program_name, exe);
    if (!PyStatus_Exception(status))
        status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        snprintf(pb_start_error, sizeof pb_start_error,
                 "pybridge core failed to start: Python (%s) did not initialize: %s",
                 exe, status.err_msg ? status.err_msg : "unknown error");
        return;
    }
    pb_unblock_cffi_lock();
    PyEval_SaveThread();  /* release the GIL: every call takes it through cffi */
    pb_python_ours = 1;
    pb_python_ok = 1;
}

/* Give each calling OS thread a Python thread state that lives as long as the thread.
 * Otherwise cffi creates and destroys one around every call made from a thread that
 * Python did not start, which is every call from a Go program (goroutines run on
 * threads of Go's own). */
static __thread int pb_thread_attached = 0;

static int pb_python_ready(void) {
    pthread_once(&pb_python_once, pb_start_python);
    if (pb_python_ok && !pb_thread_attached) {
        pb_thread_attached = 1;
        if (PyGILState_GetThisThreadState() == NULL) {
            PyGILState_Ensure();  /* never released: keeps the thread state */
            PyEval_SaveThread();
        }
    }
    return pb_python_ok;
}

CFFI_DLLEXPORT const char *pb_last_error(void) { return pb_errmsg; }

CFFI_DLLEXPORT const char *pb_version(void) { return "@VERSION@"; }

CFFI_DLLEXPORT const char *pb_status_name(int status) {
    switch (status) {
@STATUS_CASES@
    default: return "PB_UNKNOWN";
    }
}
"""

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


def prototypes(header_text):
    """(name, argument list) of every int-returning function in the header."""
    for name, args in PROTO.findall(header_text):
        yield name, " ".join(args.split())


def arg_names(args):
    return ", ".join(re.findall(r"(\w+)\s*(?:,|$)", args))


def declarations(header_text):
    """The header's constants and types, in the subset of C that cffi's cdef parses."""
    lines = []
    for line in header_text.splitlines():
        m = re.match(r"#define (PB_\w+) (-?\d+)", line)
        if m:
            lines.append(f"#define {m.group(1)} {m.group(2)}")
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


def status_cases(header):
    """pb_status_name's cases, from the header's status codes (PB_OK and PB_ERR_*)."""
    names = re.findall(r"^#define (PB_OK|PB_ERR_\w+) ", header, re.M)
    return "\n".join(f'    case {n}: return "{n}";' for n in names)


def wrappers(header_text):
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


def compile_library(lib_dir, include_dir, root_first, exclude=()):
    """Build lib_dir/libpybridge.so embedding this interpreter and the pybridge it imports.

    root_first: put the folder holding that pybridge first on the embedded sys.path (a
    checkout must win over whatever an editable install points at). `exclude`: sys.path
    entries not to carry over (the build script's own folder, the current directory).
    """
    import cffi

    root = os.path.dirname(PACKAGE)
    with open(HEADER) as f:
        header = f.read()
    # An installed pybridge keeps its place on the path; one found another way (an editable
    # install's import hook) goes first, as a checkout does.
    root_first = root_first or root not in sys.path
    kept = [p for p in sys.path if p and os.path.isdir(p) and (p == root or p not in exclude)]
    config = {
        "python": sys.executable,
        "pybridge_root": root if root_first else None,
        "sys_path": [p for p in kept if p != root] if root_first else kept,
        "site_dirs": site.getsitepackages() + [site.getusersitepackages()],
    }
    libdir = sysconfig.get_config_var("LIBDIR")
    ffi = cffi.FFI()
    ffi.cdef(cdef_text(header))
    ffi.embedding_api("")
    ffi.set_source("_pybridge_capi",
                   C_SOURCE.replace("@VERSION@", version()).replace("@PYTHON@", sys.executable)
                   .replace("@STATUS_CASES@", status_cases(header)) + wrappers(header),
                   include_dirs=[include_dir],
                   extra_compile_args=["-O2"],
                   # nodelete: once the interpreter runs, it holds code and objects of this
                   # library, so a host's dlclose() must never unmap it.
                   extra_link_args=[f"-Wl,-rpath,{libdir}", "-Wl,-soname,libpybridge.so",
                                    "-Wl,-z,nodelete"])
    ffi.embedding_init_code(INIT_CODE.replace("@CONFIG@", repr(json.dumps(config))))
    os.makedirs(lib_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib_dir, prefix=".cffi-") as tmp:
        built = ffi.compile(tmpdir=tmp, target="libpybridge.*", verbose=False)
        final = os.path.join(lib_dir, "libpybridge.so")
        os.replace(built, final)  # atomic: a running program keeps the old file
    return final


def write_pc(path, libdir, includedir, prefix=None):
    """pybridge.pc: the flags cgo and C builds get from `pkg-config pybridge`."""
    head = f"prefix={prefix}\nlibdir=${{prefix}}/lib\nincludedir=${{prefix}}/include\n" if prefix else \
        f"libdir={libdir}\nincludedir={includedir}\n"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(head + "\nName: pybridge\nDescription: data-parallel training over torch.distributed\n"
                f"Version: {version()}\n"
                "Cflags: -I${includedir}\n"
                "Libs: -L${libdir} -lpybridge -Wl,-rpath,${libdir}\n")


def build_checkout(out_dir, include_dir, exclude):
    """The checkout's layout (make): out_dir/libpybridge.so and out_dir/pybridge.pc, the
    header read from include_dir (capi/), the checkout's pybridge first on the path."""
    out_dir = os.path.abspath(out_dir)
    lib = compile_library(out_dir, include_dir, root_first=True, exclude=exclude)
    write_pc(os.path.join(out_dir, "pybridge.pc"), out_dir, include_dir)
    return lib


def default_prefix():
    """The active virtual environment, else the user base (~/.local): never a system folder."""
    return sys.prefix if sys.prefix != sys.base_prefix else site.getuserbase()


def layout(prefix):
    prefix = os.path.abspath(prefix)
    lib = os.path.join(prefix, "lib")
    return {"prefix": prefix, "lib": lib, "include": os.path.join(prefix, "include"),
            "pkgconfig": os.path.join(lib, "pkgconfig")}


def build_prefix(prefix):
    """The installed layout: PREFIX/lib/libpybridge.so, PREFIX/include/pybridge.h,
    PREFIX/lib/pkgconfig/pybridge.pc."""
    d = layout(prefix)
    os.makedirs(d["include"], exist_ok=True)
    shutil.copyfile(HEADER, os.path.join(d["include"], "pybridge.h"))
    script_dir = [] if getattr(sys.flags, "safe_path", False) else sys.path[:1]
    lib = compile_library(d["lib"], d["include"], root_first=False, exclude=script_dir + [os.getcwd()])
    write_pc(os.path.join(d["pkgconfig"], "pybridge.pc"), None, None, prefix=d["prefix"])
    return lib


def _build_or_say_why(prefix):
    """build_prefix, with a one-line reason on stderr (and None) for what users can fix."""
    import cffi

    try:
        return build_prefix(prefix)
    except OSError as exc:  # a prefix that cannot be written
        why = f"cannot write under {os.path.abspath(prefix)}: {exc}"
    except cffi.VerificationError as exc:  # the C compiler or the link failed (its output is above)
        why = (f"compiling libpybridge.so failed ({exc}); it needs a C compiler ($CC or cc) and this "
               f"Python's headers ({os.path.join(sysconfig.get_path('include'), 'Python.h')})")
        if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
            why += f", and a shared libpython, which {sys.executable} was built without"
    print(f"{PROG}: {why}", file=sys.stderr)
    return None


def _query(opts):
    d = layout(opts.prefix)
    pc = os.path.join(d["pkgconfig"], "pybridge.pc")
    if (opts.cflags or opts.libs or opts.pkg_config_path) and not os.path.exists(pc):
        sys.stderr.write(f"{PROG}: {pc} does not exist: run `python -m pybridge.capi build"
                         f" --prefix {d['prefix']}` first\n")
        return 1
    out = []
    if opts.go_dir:
        out.append(GO_MODULE)
    if opts.pkg_config_path:
        out.append(d["pkgconfig"])
    if opts.cflags:
        out.append(f"-I{d['include']}")
    if opts.libs:
        out.append(f"-L{d['lib']} -lpybridge -Wl,-rpath,{d['lib']}")
    print(" ".join(out))
    return 0


def pc_variables(path):
    """A .pc file's variables, ${name} references expanded."""
    values = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"(\w+)=(.*)$", line.strip())
            if m:
                values[m[1]] = re.sub(r"\$\{(\w+)\}", lambda r: values.get(r[1], ""), m[2])
    return values


def check_pkg_config_path(value):
    """(the pybridge.pc that pkg-config would use or None, [what is wrong]) for
    PKG_CONFIG_PATH=value, as cgo runs pkg-config: in each package's own folder."""
    hint = "export PKG_CONFIG_PATH=$(pybridge-capi --pkg-config-path [--prefix DIR])"
    entries = [p for p in (value or "").split(os.pathsep) if p]
    if not entries:
        return None, [f"PKG_CONFIG_PATH is not set, so pkg-config cannot find pybridge.pc: {hint}"]
    problems = [f"PKG_CONFIG_PATH entry {p!r} is relative: go build runs pkg-config in each package's "
                f"own folder, where it names another place; use an absolute path ({os.path.abspath(p)})"
                for p in entries if not os.path.isabs(p)]
    found = next((os.path.join(p, "pybridge.pc") for p in entries
                  if os.path.isabs(p) and os.path.isfile(os.path.join(p, "pybridge.pc"))), None)
    if found is None:
        problems.append(f"no pybridge.pc in any absolute PKG_CONFIG_PATH folder ({value}): run "
                        f"`pybridge-capi build [--prefix DIR]`, then {hint}")
        return None, problems
    v = pc_variables(found)
    for f in (os.path.join(v.get("libdir", ""), "libpybridge.so"), os.path.join(v.get("includedir", ""), "pybridge.h")):
        if not os.path.isfile(f):
            problems.append(f"{found} names {f}, which does not exist: build again (pybridge-capi build)")
    return found, problems


def _check():
    found, problems = check_pkg_config_path(os.environ.get("PKG_CONFIG_PATH"))
    if found:
        print(f"pkg-config finds {found} (libdir {pc_variables(found).get('libdir')})")
    for p in problems:
        print(f"{PROG}: {p}", file=sys.stderr)
    return 1 if problems else 0


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog=PROG, description="Build the pybridge C library for this Python environment, or print "
        "the flags to compile and link against it.",
        epilog="example: python -m pybridge.capi build && export PKG_CONFIG_PATH=$(python -m "
        "pybridge.capi --pkg-config-path) && gcc prog.c $(pkg-config --cflags --libs pybridge)")
    parser.add_argument("command", nargs="?", choices=["build", "check"],
                        help="build: PREFIX/lib/libpybridge.so, PREFIX/include/pybridge.h and "
                        "PREFIX/lib/pkgconfig/pybridge.pc; check: say whether PKG_CONFIG_PATH leads "
                        "pkg-config (and cgo) to a pybridge.pc whose library exists")
    parser.add_argument("--prefix", default=default_prefix(),
                        help="where to build, or to look (default: %(default)s)")
    parser.add_argument("--cflags", action="store_true", help="print the compiler flags")
    parser.add_argument("--libs", action="store_true", help="print the linker flags")
    parser.add_argument("--pkg-config-path", action="store_true",
                        help="print the folder holding pybridge.pc (for PKG_CONFIG_PATH)")
    parser.add_argument("--go-dir", action="store_true",
                        help="print the folder of the Go module shipped in this package (for a "
                        "`replace github.com/pybridge/pybridge/go => DIR` directive)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    opts = parser.parse_args(argv)
    queries = opts.cflags or opts.libs or opts.pkg_config_path or opts.go_dir
    if opts.command is None and not queries:
        parser.error("say what to do: build, check, --cflags, --libs, --pkg-config-path or --go-dir")
    if opts.command and queries:
        parser.error(f"{opts.command} takes no query flags; run the query on its own")
    if opts.command == "check":
        return _check()
    if opts.command == "build":
        lib = _build_or_say_why(opts.prefix)
        if lib is None:
            return 1
        d = layout(opts.prefix)
        print(f"built {lib} for {sys.executable} (pybridge {version()} from {PACKAGE})\n"
              f"  header:     {os.path.join(d['include'], 'pybridge.h')}\n"
              f"  pkg-config: {os.path.join(d['pkgconfig'], 'pybridge.pc')}\n"
              f"  Go module:  {GO_MODULE}\n"
              f"use it with:  export PKG_CONFIG_PATH={d['pkgconfig']}")
        return 0
    return _query(opts)


if __name__ == "__main__":
    sys.exit(main())
