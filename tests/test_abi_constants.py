"""capi/pybridge.h is the one source of the ABI: pybridge/abi.py (constants) and go/pbgo_gen.h
(Go's trampolines) are generated from it and current, Python and Go take their codes from it,
and no hand-written copy remains."""

import glob
import os
import re
import subprocess
import sys

import pytest

from pybridge import abi, errors
from pybridge.comm import collectives
from pybridge.base import dtypes
from pybridge.ddp import reducer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "capi"))
import gen_abi  # noqa: E402


def header():
    with open(gen_abi.HEADER) as f:
        return f.read()


def test_generated_module_is_current():
    run = subprocess.run([sys.executable, os.path.join(ROOT, "capi", "gen_abi.py"), "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
    values = {name: value for name, value, _ in gen_abi.constants(header())}
    assert len(values) >= 30
    assert all(getattr(abi, name) == value for name, value in values.items())


def test_check_notices_a_changed_header(tmp_path, monkeypatch):
    changed = header().replace("#define PB_HOOK_FP16 1", "#define PB_HOOK_FP16 5")
    stale = tmp_path / "pybridge.h"
    stale.write_text(changed)
    monkeypatch.setattr(gen_abi, "HEADER", str(stale))
    assert gen_abi.main(["--check"]) == 1


def test_check_notices_a_changed_prototype(tmp_path, monkeypatch, capsys):
    changed = header().replace("int pb_barrier(pb_group *group);",
                               "int pb_barrier(pb_group *group, int32_t tag);")
    assert changed != header()
    stale = tmp_path / "pybridge.h"
    stale.write_text(changed)
    monkeypatch.setattr(gen_abi, "HEADER", str(stale))
    assert gen_abi.main(["--check"]) == 1
    out = capsys.readouterr().out
    assert "go/pbgo_gen.h is out of date" in out and "pybridge/abi.py" not in out, out


def test_go_trampolines_cover_every_function():
    """One generated pbgo_NAME per int pb_NAME, each passing its arguments on in order; and
    no hand-written header repeats that form (only helpers that do more stay by hand)."""
    with open(gen_abi.GO_TARGET) as f:
        generated = f.read()
    assert "Do not edit" in generated.splitlines()[0]
    protos = list(gen_abi._capi_gen.prototypes(header()))
    assert len(protos) >= 70
    found = re.findall(r"static inline int pbgo_(\w+)\(.*?return pbgo_status\(pb_(\w+)\(([^;]*?)\), msg\);",
                       generated, re.S)
    assert all(trampoline == called for trampoline, called, _ in found)
    calls = {called: " ".join(args.split()) for _, called, args in found}
    assert sorted(calls) == sorted(name[3:] for name, _ in protos)
    for name, args in protos:
        assert calls[name[3:]] == gen_abi._capi_gen.arg_names(args), name
    one_call = re.compile(r"static inline int pbgo_\w+\([^)]*\)\s*\{\s*return pbgo_status\(pb_\w+\([^;]*\), msg\);\s*\}")
    for path in glob.glob(os.path.join(ROOT, "go", "*.h")) + glob.glob(os.path.join(ROOT, "go", "*.go")):
        if path != gen_abi.GO_TARGET:
            assert not one_call.search(open(path).read()), f"{path}: a one-call trampoline written by hand"


def test_python_codes_come_from_the_header():
    assert (errors.INVALID_ARGUMENT, errors.CLOSED) == (abi.PB_ERR_INVALID_ARGUMENT, abi.PB_ERR_CLOSED)
    assert errors.Timeout.code == abi.PB_ERR_TIMEOUT
    assert (collectives.SUM, collectives.AVG, collectives.PRODUCT) == (abi.PB_SUM, abi.PB_AVG, abi.PB_PRODUCT)
    assert dtypes.BFLOAT16 == abi.PB_BFLOAT16 and dtypes.INT64 == abi.PB_INT64
    assert reducer.COMPRESS_BF16 == abi.PB_COMPRESS_BF16
    # No module but the generated one spells a code as a bare number.
    pattern = re.compile(r"^(OK|INVALID_ARGUMENT|NOT_INITIALIZED|ALREADY_INITIALIZED|TIMEOUT|COMM|IO|CORRUPT|"
                         r"INTERNAL|CLOSED|SUM|AVG|MIN|MAX|PRODUCT|FLOAT\d+|BFLOAT16|U?INT\d+|COMPRESS_\w+|"
                         r"ALLOW_UNUSED|NO_REBUILD|CPU|HOOK_\w+)(\s*,\s*\w+)*\s*=\s*(-?\d+\b|range\()", re.M)
    table = name_table_pattern()
    for path in glob.glob(os.path.join(ROOT, "pybridge", "**", "*.py"), recursive=True):
        if path.endswith("abi.py"):
            continue
        text = open(path).read()
        assert not pattern.search(text), path
        assert not table.search(text), (path, table.search(text))


def name_table_pattern():
    """A table that spells codes by hand beside their names, in either direction:
    {0: "sum", 1: "avg"} or {"float32": 0}; names are the header's, e.g. PB_SUM -> sum,
    PB_HOOK_FP16 -> fp16 or hook_fp16."""
    names = set()
    for name, _, _ in gen_abi.constants(header()):
        words = name[3:].lower().split("_")
        names.update({"_".join(words), "_".join(words[1:])} - {""})
    alt = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    return re.compile(rf"(?<![\w.])-?\d+\s*:\s*[\"']({alt})[\"']|[\"']({alt})[\"']\s*:\s*-?\d+\b")


def test_name_table_pattern_catches_hand_copies():
    table = name_table_pattern()
    assert table.search('_OP_NAMES = {0: "sum", 1: "avg", 2: "min"}')
    assert table.search("CODES = {'float32': 0}")
    assert table.search('{1: "fp16"}')
    assert not table.search('{abi.PB_SUM: "sum"}') and not table.search('{"sum": SUM}')


def test_go_codes_come_from_the_header():
    names = r"(status\w+|Sum|Avg|Min|Max|Product|dt\w+|\w+Partition|NoCompression|Compress\w+|Hook\w+|CPU)"
    literal = re.compile(rf"^\s*(const\s+)?{names}\s+(\w+\s+)?=\s*-?\d+\s*(//.*)?$", re.M)
    flags = re.compile(r"flags \|= \d")
    for path in glob.glob(os.path.join(ROOT, "go", "*.go")):
        if path.endswith("_test.go"):
            continue
        text = open(path).read()
        assert not literal.search(text) and not flags.search(text), path


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "build", "libpybridge.so")), reason="make setup")
def test_status_names_follow_the_header():
    from capi_loader import load
    ffi, lib = load()
    for name, value, _ in gen_abi.constants(header()):
        if name == "PB_OK" or name.startswith("PB_ERR_"):
            assert ffi.string(lib.pb_status_name(value)).decode() == name
    assert ffi.string(lib.pb_status_name(12345)) == b"PB_UNKNOWN"
