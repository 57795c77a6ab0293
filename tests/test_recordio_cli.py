"""python -m pybridge.recordio pack | cat | inspect | verify."""

import io
import os
import subprocess
import sys

import pytest

from pybridge import recordio as rio
from pybridge.recordio.__main__ import main
from recordio_spec import golden_path


def run(capsysbinary, argv, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(argv)
    out, err = capsysbinary.readouterr()
    return code, out.decode(), err.decode()


def test_pack_stdin_lines_into_shards(tmp_path, capsysbinary, monkeypatch):
    prefix = str(tmp_path / "lines")
    lines = b"".join(b"line %d\n" % i for i in range(25)) + b"\nno newline at the end"
    code, out, _ = run(capsysbinary, ["pack", "-o", prefix, "-n", "10", "-c", "gzip"], lines, monkeypatch)
    assert code == 0
    shards = sorted(p for p in os.listdir(tmp_path))
    assert shards == ["lines-00000.recordio", "lines-00001.recordio", "lines-00002.recordio"]
    assert "lines-00002.recordio\t7 records" in out
    got = [r for s in shards for r in rio.read_file(str(tmp_path / s))]
    assert got == [b"line %d" % i for i in range(25)] + [b"", b"no newline at the end"]
    with rio.Reader(str(tmp_path / shards[0])) as r:
        assert {c.compressor_name for c in r.chunks} == {"gzip"}


def test_pack_files_and_lines_of_files(tmp_path, capsysbinary):
    inputs = []
    for i in range(3):
        p = tmp_path / f"in{i}.bin"
        p.write_bytes(bytes(range(i, i + 50)))
        inputs.append(str(p))
    code, _, _ = run(capsysbinary, ["pack", "-o", str(tmp_path / "files"), *inputs])
    assert code == 0
    assert rio.read_file(str(tmp_path / "files-00000.recordio")) == [bytes(range(i, i + 50)) for i in range(3)]
    (tmp_path / "text.txt").write_bytes(b"a\nb\n")
    code, _, _ = run(capsysbinary, ["pack", "--lines", "-c", "none", "-o", str(tmp_path / "t"),
                                    str(tmp_path / "text.txt")])
    assert code == 0 and rio.read_file(str(tmp_path / "t-00000.recordio")) == [b"a", b"b"]


def test_pack_without_records_writes_nothing(tmp_path, capsysbinary, monkeypatch):
    code, _, err = run(capsysbinary, ["pack", "-o", str(tmp_path / "x")], b"", monkeypatch)
    assert code == 0 and os.listdir(tmp_path) == [] and "nothing written" in err


def test_cat(capsysbinary):
    path = golden_path("mixed")
    code, out, _ = run(capsysbinary, ["cat", path])
    assert code == 0 and out == "abc\ndefgh\n\nijklmnop\nGo\ntorch\nGo\ntorch\n"
    code, out, _ = run(capsysbinary, ["cat", "--start", "3", "--count", "2", "--format", "repr", path])
    assert out == "b'ijklmnop'\nb'Go'\n"
    code, out, _ = run(capsysbinary, ["cat", "--format", "hex", "--count", "1", path])
    assert out == "616263\n"


def test_inspect(capsysbinary):
    code, out, _ = run(capsysbinary, ["inspect", golden_path("mixed")])
    assert code == 0
    assert "183 bytes, 4 chunks, 8 records, compressor gzip, none, snappy" in out
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [
        ("0", "0", "none", "3"), ("1", "40", "none", "1"), ("2", "72", "snappy", "2"), ("3", "125", "gzip", "2")]
    code, out, _ = run(capsysbinary, ["inspect", "--summary", golden_path("none")])
    assert out.count("\n") == 1


def test_verify_ok_and_corrupt(tmp_path, capsysbinary):
    good = golden_path("mixed")
    code, out, _ = run(capsysbinary, ["verify", good])
    assert code == 0 and out.startswith(f"ok {good}: 4 chunks, 8 records")
    data = bytearray(open(good, "rb").read())
    data[72 + 20 + 5] ^= 0xFF  # inside chunk 2's payload
    bad = tmp_path / "bad.recordio"
    bad.write_bytes(bytes(data))
    code, out, _ = run(capsysbinary, ["verify", good, str(bad), str(tmp_path / "missing.recordio")])
    assert code == 1
    assert f"CORRUPT {bad}: chunk 2, byte offset 72: checksum mismatch" in out
    assert "missing.recordio: cannot open" in out
    assert out.startswith(f"ok {good}")


def test_usage_errors(capsysbinary, tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert main(["pack", "-o", str(tmp_path / "x"), "-n", "0"]) == 2
    assert main(["cat", str(tmp_path / "missing")]) == 1
    assert "cannot open" in capsysbinary.readouterr().err.decode()


def test_module_entry_point(tmp_path):
    # The real `python -m` path (also what the pybridge-recordio console script calls).
    prefix = str(tmp_path / "e")
    proc = subprocess.run([sys.executable, "-m", "pybridge.recordio", "pack", "-o", prefix, "-n", "2"],
                          input=b"x\ny\nz\n", capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr.decode()
    proc = subprocess.run([sys.executable, "-m", "pybridge.recordio", "verify", prefix + "-00000.recordio",
                           prefix + "-00001.recordio"], capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.count(b"ok ") == 2


def test_pack_creates_the_output_folder(tmp_path, capsysbinary, monkeypatch):
    prefix = str(tmp_path / "new" / "deeper" / "shard")
    code, out, _ = run(capsysbinary, ["pack", "-o", prefix, "-n", "2"], b"a\nb\nc\n", monkeypatch)
    assert code == 0, out
    assert sorted(os.listdir(tmp_path / "new" / "deeper")) == ["shard-00000.recordio", "shard-00001.recordio"]
