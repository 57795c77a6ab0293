"""Build libpybridge.so (cffi embedding mode), its header and a pkg-config file.

    python -m pybridge.capi build [--prefix DIR]      (or: pybridge-capi build ...)
    python -m pybridge.capi --cflags | --libs | --pkg-config-path | --go-dir [--prefix DIR]
    python -m pybridge.capi check        (is PKG_CONFIG_PATH right for cgo?)
    python -m pybridge.capi --torch-cflags | --torch-libs   (C++ against the torch wheel's libtorch)

`build` writes DIR/lib/libpybridge.so, DIR/include/pybridge.h and
DIR/lib/pkgconfig/pybridge.pc. The library embeds the interpreter running this command
and the pybridge package it imports, so run it with the environment's own python
after `pip install pybridge`. DIR defaults to the active virtual environment
(sys.prefix), else to the user base (~/.local). The queries print compiler and linker
flags (or the folder to put on PKG_CONFIG_PATH), like python3-config; --go-dir prints the
folder of the Go module the package ships, for a `replace` directive (no module proxy needed).

This module is the command line. The build is library.py (in a checkout, `make`
runs it through capi/build.py: build/libpybridge.so and build/pybridge.pc, embedding the
checkout's pybridge first); the C it compiles is generated from the header by gen.py
over the hand-written runtime runtime.c: each `int pb_NAME(...)` of the header,
except the pure-C ones, becomes a thin C wrapper over an `extern "Python"` function
`_pb_py_NAME` implemented in the pybridge/capi/ package. The wrappers exist for one reason:
if the embedded Python core cannot start, cffi would make every call return 0 (PB_OK); the
wrapper turns that into PB_ERR_INTERNAL with the start-up error as message.
"""

import argparse
import os
import re
import sys
import sysconfig

from .library import GO_MODULE, PACKAGE, build_prefix, default_prefix, layout, version

PROG = "pybridge-capi"


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


def torch_flags():
    """(compiler flags, linker flags) for C++ that computes with the torch wheel's libtorch,
    the one the embedded core loads: one libtorch in the process."""
    import torch
    from torch.utils import cpp_extension
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    cflags = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-D_GLIBCXX_USE_CXX11_ABI={abi}"]
    libs = [f"-L{p} -Wl,-rpath,{p}" for p in cpp_extension.library_paths()] + ["-ltorch", "-ltorch_cpu", "-lc10"]
    if torch.version.cuda is not None:  # a CUDA build: its device code registers from these
        libs += ["-Wl,--no-as-needed", "-ltorch_cuda", "-lc10_cuda", "-Wl,--as-needed"]
    return " ".join(cflags), " ".join(libs)


def torch_headers_missing():
    """Why C++ cannot be compiled against the installed torch (its headers are not there),
    or None."""
    import torch
    from torch.utils import cpp_extension
    want = os.path.join("ATen", "ATen.h")
    if any(os.path.exists(os.path.join(p, want)) for p in cpp_extension.include_paths()):
        return None
    return (f"the torch at {os.path.dirname(torch.__file__)} has no C++ headers ({want} is not under "
            f"{', '.join(cpp_extension.include_paths())}): install a torch wheel that ships them (pip's do) "
            "to compile C++ against its libtorch; tensors by handle need no headers in pybridge itself")


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
    parser.add_argument("--torch-cflags", action="store_true",
                        help="print the compiler flags for C++ code that uses the torch wheel's libtorch "
                        "(its headers and ABI; compile as C++17 or later)")
    parser.add_argument("--torch-libs", action="store_true",
                        help="print the linker flags for that libtorch (the one the library loads)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    opts = parser.parse_args(argv)
    if opts.torch_cflags or opts.torch_libs:
        if opts.command or opts.cflags or opts.libs or opts.pkg_config_path or opts.go_dir:
            parser.error("--torch-cflags and --torch-libs go on their own")
        missing = torch_headers_missing() if opts.torch_cflags else None
        if missing:
            print(f"pybridge-capi: {missing}", file=sys.stderr)
            return 1
        cflags, libs = torch_flags()
        print(" ".join(f for f, wanted in ((cflags, opts.torch_cflags), (libs, opts.torch_libs)) if wanted))
        return 0
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
