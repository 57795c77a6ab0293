"""Messages that reach C callers name C's functions, types and constants (issue 30 item 6):
`call pb_finalize first`, not `call finalize() first`; `PB_INT32`, not `torch.int32`. The
core speaks Python; the C adapter translates its messages once (pybridge/capi/names.py),
and Go translates the C names to its own (goNames in go/errors.go, go/words_test.go)."""

import ast
import glob
import os
import re
import sys
import types

import pytest

from capi_loader import LIB_PATH, ROOT, init_world, last_error, load
from ranks import run_ranks

sys.path.insert(0, os.path.join(ROOT, "capi"))
import gen_abi  # noqa: E402

needs_lib = pytest.mark.skipif(not os.path.exists(LIB_PATH), reason="run `make setup` to build libpybridge.so")

# Python's spellings: a call `name()`, a keyword `name=`, a torch type, a Python class
# where a C type belongs, a note for another language.
PYTHON = re.compile(r"\w\(\)|\b[a-z_]+=|torch\.|MembershipChanged|CReducer|LoaderHandle|PeriodicModelAverager|"
                    r"\bCState\b|\bFedServer\b|\bFedWorker\b|\bBuffer\b|\bWork\b|\(C: |Go: |\bWith[A-Z]\w+|"
                    r"elastic\.init")


def _say(ffi, lib, rc):
    return int(rc), last_error(ffi, lib)


def words_rank(rank, world, path, ckdir):
    import pybridge.runtime.elastic as elastic
    ffi, lib = load()
    got = {}

    def call(what, rc):
        got[what] = _say(ffi, lib, rc)

    # Before pb_init. Elastic without the launcher's store.
    saved = {k: os.environ.pop(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    call("elastic store", lib.pb_elastic_init(ffi.NULL, ffi.NULL, 5.0, ffi.new("pb_group **")))
    os.environ.update(saved)
    # Elastic while an elastic world is live (the session is all that check reads).
    elastic._session = types.SimpleNamespace(group=types.SimpleNamespace(closed=False))
    try:
        call("elastic live", lib.pb_elastic_init(ffi.NULL, ffi.NULL, 5.0, ffi.new("pb_group **")))
    finally:
        elastic._session = None
    # A stale handle of every kind names the C type.
    for kind in ("group", "buffer", "work", "loader", "reducer", "averager", "state", "fed_server", "fed_worker"):
        stale = ffi.cast(f"pb_{kind} *", 0x5042_FFF0)
        call(f"stale {kind}", getattr(lib, f"pb_{kind}_close")(stale))
    call("buffer count", lib.pb_buffer_new(lib.PB_INT32, 2**62, lib.PB_CPU, ffi.new("pb_buffer **")))
    sp = ffi.new("pb_state **")
    assert lib.pb_state_create(sp) == 0
    call("not elastic", lib.pb_state_reset(sp[0], 0, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL,
                                           ffi.new("pb_group **"), ffi.new("int64_t *")))
    assert lib.pb_state_close(sp[0]) == 0

    g = init_world(ffi, lib)
    call("second init", lib.pb_init(ffi.NULL, b"gloo", -1, -1, -1, 30.0, ffi.new("pb_group **")))
    x = ffi.new("int32_t[2]")
    t = ffi.new("pb_tensor *", {"data": x, "count": 2, "dtype": lib.PB_INT32, "device": lib.PB_CPU})
    call("avg int32", lib.pb_all_reduce(g, t, lib.PB_AVG))

    rp = ffi.new("pb_reducer **")
    counts, dts = ffi.new("int64_t[]", [4, 2]), ffi.new("int32_t[]", [lib.PB_FLOAT32] * 2)
    assert lib.pb_reducer_create(g, 2, counts, dts, ffi.NULL, rp) == 0, last_error(ffi, lib)
    r = rp[0]
    w = ffi.new("float[4]", [1, 2, 3, 4])
    names = [ffi.new("char[]", b"w")]
    cnames = ffi.new("char *[]", names)
    tw = ffi.new("pb_tensor *", {"data": w, "count": 4, "dtype": lib.PB_FLOAT32, "device": lib.PB_CPU})
    dirname = ffi.new("char[]", ckdir.encode())
    assert lib.pb_checkpoint_save(dirname, 1, 1, cnames, tw, ffi.NULL, r, 0) == 0, last_error(ffi, lib)
    sp = ffi.new("pb_state **")
    assert lib.pb_state_create(sp) == 0
    assert lib.pb_state_commit(sp[0], 1, 1, cnames, tw, ffi.NULL, r) == 0, last_error(ffi, lib)
    # An iteration under way: calls that belong between iterations name themselves.
    assert lib.pb_reducer_mark_ready(r, 0) == 0
    call("marked twice", lib.pb_reducer_mark_ready(r, 0))
    call("set shapes", lib.pb_reducer_set_shapes(r, 2, ffi.new("int32_t[]", [0, 0]), ffi.new("int64_t[1]")))
    call("set hook", lib.pb_reducer_set_hook(r, lib.PB_HOOK_FP16, 1, 0))
    grads = ffi.new("pb_tensor[2]")
    for i, n in enumerate((4, 2)):
        grads[i].data, grads[i].count = ffi.new("float[]", n), n
        grads[i].dtype, grads[i].device = lib.PB_FLOAT32, lib.PB_CPU
    call("bind grads", lib.pb_reducer_bind_grads(r, 2, grads))
    step = ffi.new("int64_t *")
    call("checkpoint restore", lib.pb_checkpoint_restore(g, dirname, 1, cnames, tw, ffi.NULL, r, step))
    call("state restore", lib.pb_state_restore(sp[0], 1, cnames, tw, ffi.NULL, r, step))
    call("unmarked", lib.pb_reducer_wait(r, 10.0))
    call("join", lib.pb_reducer_join(r, ffi.NULL, ffi.NULL))

    name = ffi.new("char[]", path.encode())
    files = ffi.new("char *[]", [name])
    lp = ffi.new("pb_loader **")
    rc = lib.pb_loader_open(g, files, 1, 4, lib.PB_PARTITION_DYNAMIC, 0, 0, 0, 0, lp)
    assert rc == 0, last_error(ffi, lib)
    call("dynamic checkpoint", lib.pb_checkpoint_save(dirname, 2, 1, cnames, tw, lp[0], ffi.NULL, 0))
    assert lib.pb_loader_close(lp[0]) == 0 and lib.pb_state_close(sp[0]) == 0 and lib.pb_reducer_close(r) == 0
    assert lib.pb_finalize(g) == 0
    return got


# what -> the C names its message must hold
EXPECT = {
    "elastic store": ["pb_elastic_init: ", "launcher's store"],
    "elastic live": ["pb_state_reset after PB_ERR_MEMBERSHIP", "pb_finalize to leave"],
    **{f"stale {k}": [f"not a live pb_{k} handle"]
       for k in ("group", "buffer", "work", "loader", "reducer", "averager", "state", "fed_server", "fed_worker")},
    "buffer count": ["of PB_INT32 is"],
    "not elastic": ["pb_state_reset: this process is not in an elastic job (join it with pb_elastic_init)"],
    "second init": ["call pb_finalize first"],
    "avg int32": ["got PB_INT32"],
    "marked twice": ["between pb_reducer_wait calls"],
    "set shapes": ["pb_reducer_set_shapes: pb_reducer_set_shapes must be called between iterations"],
    "set hook": ["pb_reducer_set_hook: pb_reducer_set_hook must be called between iterations"],
    "bind grads": ["pb_reducer_bind_grads: pb_reducer_bind_grads must be called between iterations"],
    "checkpoint restore": ["pb_checkpoint_restore: pb_checkpoint_restore must be called between iterations"],
    "state restore": ["pb_state_restore: pb_state_restore must be called between iterations"],
    "unmarked": ["create the reducer with PB_REDUCER_ALLOW_UNUSED so that"],
    "join": ["pb_reducer_join needs a reducer created with PB_REDUCER_JOIN on every rank"],
    "dynamic checkpoint": ["resume mid-epoch with PB_PARTITION_STATIC"],
}


@needs_lib
def test_c_messages_name_c_functions_and_types(tmp_path):
    from pybridge.recordio import Writer
    path = str(tmp_path / "d.rio")
    with Writer(path) as w:
        for i in range(8):
            w.write(f"record {i}".encode())
    [got] = run_ranks(words_rank, 1, path, str(tmp_path / "ck"), timeout=90)
    assert sorted(got) == sorted(EXPECT)
    bad = []
    for what, (rc, msg) in got.items():
        function = msg.partition(": ")[0]  # named once, first
        if rc == 0 or not all(w in msg for w in EXPECT[what]) or PYTHON.search(msg) or f"{function}: {function}: " in msg:
            bad.append(f"{what}: {rc} {msg!r}")
    assert not bad, "\n".join(bad)


# ---- the tables ------------------------------------------------------------------------

def _header_names():
    with open(gen_abi.HEADER) as f:
        text = f.read()
    names = {name for name, _, _ in gen_abi.constants(text)}
    names |= {name for name, _ in gen_abi._capi_gen.prototypes(text)}
    names |= set(re.findall(r"\btypedef struct (pb_\w+)", text))
    return names


def _core_messages():
    """Every string the core writes, with its {} fields left as {}."""
    texts = []
    for path in glob.glob(os.path.join(ROOT, "pybridge", "**", "*.py"), recursive=True):
        if os.sep + "capi" + os.sep in path or os.sep + "cbuild" + os.sep in path:
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.JoinedStr):
                texts.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                texts.append(node.value)
    return texts


def _c_names(value):
    return set(re.findall(r"\b(?:pb|PB)_\w+", " ".join(value) if isinstance(value, tuple) else value))


def test_every_python_spelling_is_one_the_core_writes():
    """A core message rephrased leaves no stale entry: each spelling is still in a message
    (the dtypes, formatted into messages, are checked against the ABI instead)."""
    from pybridge import abi
    from pybridge.base import dtypes
    from pybridge.capi import names
    texts = _core_messages()
    for python, c in names.WORDS.items():
        if python.startswith("torch."):
            assert getattr(abi, c) == dtypes.code(getattr(__import__("torch"), python[6:])), (python, c)
        else:
            assert any(python in t for t in texts), f"{python!r}: no core message says it"


def test_c_names_are_the_headers():
    from pybridge.capi import names
    header = _header_names()
    used = set().union(*map(_c_names, names.WORDS.values()), names.HANDLE_TYPES.values())
    assert used and used <= header, used - header


def _go_map(path, var):
    """A Go map[string]string literal of C name -> Go name."""
    text = open(os.path.join(ROOT, "go", path)).read()
    body = re.search(rf"var {var} = map\[string\]string\{{(.*?)\n\}}", text, re.S).group(1)
    return dict(re.findall(r'"(\w+)":\s*"([\w.]+)"', body))


def _go_names():
    """What goWords translates: go/errors.go's goNames (written) over go/names_gen.go's
    goConstants (generated from Go's constants)."""
    return {**_go_map("names_gen.go", "goConstants"), **_go_map("errors.go", "goNames")}


def _go_calls():
    """The C functions Go calls: through C.pbgo_NAME, or in a hand-written helper."""
    called = set()
    for path in glob.glob(os.path.join(ROOT, "go", "*.go")) + glob.glob(os.path.join(ROOT, "go", "pbgo*.h")):
        if path.endswith("_test.go") or path == gen_abi.GO_TARGET:
            continue
        text = open(path).read()
        called |= {"pb_" + name for name in re.findall(r"\bC\.pbgo_(\w+)", text)}
        called |= set(re.findall(r"\b(pb_\w+)\(", text))
    return called


def test_go_names_every_c_name_a_message_may_hold():
    """Go's table covers every C name the C adapter writes in place of a Python one (but
    functions Go never calls), names only what the header names, and agrees with Go's
    own constants (Sum = C.PB_SUM)."""
    from pybridge.capi import names
    go = _go_names()
    with open(gen_abi.HEADER) as f:
        header_words = set(re.findall(r"\w+", f.read()))  # functions, types, constants, fields
    assert set(go) <= header_words, set(go) - header_words
    wanted = set().union(*map(_c_names, names.WORDS.values()), names.HANDLE_TYPES.values())
    calls = _go_calls()
    assert {"pb_reducer_wait", "pb_finalize", "pb_state_reset"} <= calls
    wanted = {n for n in wanted if n.startswith("PB_") or n in names.HANDLE_TYPES.values() or n in calls}
    assert wanted <= set(go), wanted - set(go)
    # Go's constants are in the generated table (gen_abi.go_constants); the flag options,
    # written by hand, name the flag they set.
    generated = _go_map("names_gen.go", "goConstants")
    assert {"PB_SUM", "PB_HOOK_FP16", "PB_PARTITION_STATIC", "PB_FED_STRATEGY_FEDYOGI"} <= set(generated)
    assert generated == gen_abi.go_constants()
    written = _go_map("errors.go", "goNames")
    assert not {c for c in written if generated.get(c) == written[c]}, "goNames repeats generated entries"
    flags = {}
    for path in glob.glob(os.path.join(ROOT, "go", "*.go")):
        flags.update({c: g for g, c in re.findall(
            r"^func (With\w+)\(\) \w+ \{\s*return func\(c \*\w+\) \{ c\.(?:o\.)?flags \|= (?:C\.PB_\w+ \| )*C\.(PB_\w+) \}",
            open(path).read(), re.M)})
    assert "PB_REDUCER_JOIN" in flags
    assert {c: go.get(c) for c in flags} == flags
