"""One libtorch in the process: a C or Go program that computes with libtorch must link
the torch wheel's libtorch, the one the embedded core imports (`pybridge-capi
--torch-libs`). The dynamic loader matches libraries by soname, so a program linked
against another libtorch would have torch's Python bindings run on that one: a crash or
wrong results far from the cause. The core refuses to start instead, naming both."""

import os

LIBRARIES = ("libtorch_cpu.so", "libtorch.so", "libc10.so", "libtorch_cuda.so", "libc10_cuda.so")


def mapped(maps_text):
    """{library name: set of real paths} of the LIBRARIES in a /proc/<pid>/maps text."""
    found = {}
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        name = os.path.basename(path)
        if name in LIBRARIES:
            found.setdefault(name, set()).add(os.path.realpath(path))
    return found


def foreign(maps_text, torch_lib_dir):
    """[(library, path)] mapped from somewhere else than the torch package's lib folder."""
    want = os.path.realpath(torch_lib_dir)
    return sorted((name, path) for name, paths in mapped(maps_text).items() for path in paths
                  if os.path.dirname(path) != want)


def check():
    """Raise RuntimeError when this process maps a libtorch other than the imported torch's."""
    try:
        with open("/proc/self/maps") as f:
            text = f.read()
    except OSError:  # not Linux: nothing to compare
        return
    import torch
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    wrong = foreign(text, lib_dir)
    if wrong:
        names = ", ".join(f"{name} from {os.path.dirname(path)}" for name, path in wrong)
        raise RuntimeError(f"this process loaded a libtorch other than the one of the torch pybridge imports "
                           f"({lib_dir}): {names}. Link the torch wheel's libtorch (pybridge-capi --torch-libs) "
                           "so that the process holds one libtorch")
