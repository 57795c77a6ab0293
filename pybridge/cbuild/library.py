"""Compile libpybridge.so (cffi embedding mode) and write the files that find it.

Two layouts: a checkout's (capi/build.py, run by `make`: build/libpybridge.so and
build/pybridge.pc, the header read from capi/) and an installed one (`pybridge-capi build
--prefix DIR`: DIR/lib/libpybridge.so, DIR/include/pybridge.h, DIR/lib/pkgconfig/pybridge.pc).
The library embeds the interpreter running the build and the pybridge it imports; its C
text comes from gen.py.
"""

import json
import os
import shutil
import site
import sys
import sysconfig
import tempfile

from . import gen
from .._version import __version__

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the pybridge folder
# In a checkout these link to capi/pybridge.h and go/, the one sources; wheels carry copies.
HEADER = os.path.join(PACKAGE, "include", "pybridge.h")
GO_MODULE = os.path.join(PACKAGE, "go")  # github.com/pybridge/pybridge/go, for a `replace` directive


def version():
    return __version__


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
    ffi.cdef(gen.cdef_text(header))
    ffi.embedding_api("")
    ffi.set_source("_pybridge_capi", gen.c_source(header, version(), sys.executable),
                   include_dirs=[include_dir],
                   extra_compile_args=["-O2"],
                   # nodelete: once the interpreter runs, it holds code and objects of this
                   # library, so a host's dlclose() must never unmap it.
                   extra_link_args=[f"-Wl,-rpath,{libdir}", "-Wl,-soname,libpybridge.so",
                                    "-Wl,-z,nodelete"])
    ffi.embedding_init_code(gen.init_code(json.dumps(config)))
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
