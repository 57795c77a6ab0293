"""Every function of the C header has its Python implementation and its Go wrapper, or is
listed here as deliberately absent from Go, with the reason (docs/design.md, "Adding a
collective, end to end")."""

import glob
import importlib.util
import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_spec = importlib.util.spec_from_file_location("_pb_cbuild_gen", os.path.join(REPO, "pybridge", "cbuild", "gen.py"))
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

# Header functions Go does not wrap, and why.
NOT_IN_GO = {
    "pb_tensor_from_dlpack": "Go has no DLPack producer; Go tensors come in as slices, Buffers or TensorSource",
    "pb_tensor_from_dlpack_versioned": "as pb_tensor_from_dlpack",
    "pb_group_rank_of": "Group.RankOf searches the member list Go reads once at the group's creation "
                        "(pb_group_global_rank)",
    "pb_group_free": "deprecated alias of pb_group_close",
    "pb_buffer_free": "deprecated alias of pb_buffer_close",
    "pb_work_free": "deprecated alias of pb_work_close",
    "pb_reducer_free": "deprecated alias of pb_reducer_close",
    "pb_fed_worker_free": "deprecated alias of pb_fed_worker_close",
    "pb_reducer_new": "deprecated: NewReducer calls pb_reducer_create",
    "pb_reducer_set_hook": "deprecated: Go sets the hook at creation (pb_reducer_options)",
    "pb_reducer_set_gossip": "deprecated: Go sets gossip at creation (pb_reducer_options.gossip_*)",
    "pb_reducer_set_shapes": "Go reducers hold flat gradients (slices); shapes are for C callers' views",
    "pb_reducer_grad": "Go reads every gradient view at once through pb_reducer_grads (Reducer.Grad, GradAs, GradTensor)",
}


def _header_functions():
    with open(os.path.join(REPO, "capi", "pybridge.h")) as f:
        return [name for name, _ in gen.prototypes(f.read())]


def _text(paths):
    return "".join(open(p).read() for p in paths)


def test_every_header_function_has_a_python_implementation():
    source = _text(glob.glob(os.path.join(REPO, "pybridge", "capi", "*.py")))
    missing = [n for n in _header_functions() if n not in gen.PURE_C
               and not re.search(rf"^def {n}\(|^{n} = ", source, re.M)]
    assert not missing, f"header functions without a def in pybridge/capi/: {missing}"


def test_every_header_function_has_a_go_wrapper_or_a_reason():
    go = os.path.join(REPO, "go")
    go_source = _text(p for p in glob.glob(os.path.join(go, "*.go")) if not p.endswith("_test.go"))
    helpers = _text(p for p in glob.glob(os.path.join(go, "pbgo*.h")) if not p.endswith("pbgo_gen.h"))
    called = set(re.findall(r"C\.(pb\w+)", go_source)) | set(re.findall(r"\b(pb_\w+)\s*\(", helpers))

    def wrapped(name):
        base = name[len("pb_"):]
        return any(c == name or c == f"pbgo_{base}" or c.startswith(f"pbgo_{base}_") for c in called)

    functions = _header_functions()
    missing = [n for n in functions if not wrapped(n) and n not in NOT_IN_GO]
    assert not missing, f"header functions Go neither calls nor lists in NOT_IN_GO: {missing}"
    stale = [n for n in NOT_IN_GO if n not in functions or wrapped(n)]
    assert not stale, f"NOT_IN_GO names functions that are gone from the header or that Go now calls: {stale}"
