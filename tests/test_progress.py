"""Progress display (pybridge.base.progress): off unless stderr is a terminal or PYBRIDGE_PROGRESS=1;
tqdm when installed, a plain line otherwise; used by `pybridge-recordio pack` and the MNIST
example's prepare.py."""

import io
import os
import sys

import pytest

from pybridge.base import progress as prog
from pybridge.recordio.__main__ import main as recordio_main

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "mnist"))
import prepare  # noqa: E402


class Tty(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture
def no_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError


def test_shown_only_on_a_terminal_unless_forced(monkeypatch):
    monkeypatch.delenv("PYBRIDGE_PROGRESS", raising=False)
    assert not prog.enabled(io.StringIO()) and prog.enabled(Tty())
    monkeypatch.setenv("PYBRIDGE_PROGRESS", "0")
    assert not prog.enabled(Tty())
    monkeypatch.setenv("PYBRIDGE_PROGRESS", "1")
    assert prog.enabled(io.StringIO())


def test_nothing_written_when_off(monkeypatch):
    monkeypatch.delenv("PYBRIDGE_PROGRESS", raising=False)
    out = io.StringIO()
    with prog.progress(10, "work", stream=out) as bar:
        bar.update(10)
    assert out.getvalue() == ""


def test_plain_line_without_tqdm(no_tqdm, monkeypatch):
    monkeypatch.delenv("PYBRIDGE_PROGRESS", raising=False)
    out = Tty()
    with prog.progress(10, "work", "records", stream=out) as bar:
        for _ in range(10):
            bar.update()
    text = out.getvalue()
    assert text.startswith("\rwork: 1/10 records (10%)") and text.endswith("\rwork: 10/10 records (100%)\n"), text
    # Redrawn at most every 0.2 s, not once per update.
    assert text.count("\r") < 10, text

    out = Tty()
    with prog.progress(3 * 2**20, "download", "B", stream=out) as bar:
        bar.update(2**20)
    assert out.getvalue().endswith("\rdownload: 1.0/3.0 MiB (33%)\n"), out.getvalue()
    out = Tty()
    with prog.progress(None, "pack", "records", stream=out) as bar:
        bar.update(7)
    assert out.getvalue().endswith("\rpack: 7 records\n")


def test_tqdm_when_installed(monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    monkeypatch.delenv("PYBRIDGE_PROGRESS", raising=False)
    out = Tty()
    with prog.progress(4, "work", "records", stream=out) as bar:
        assert isinstance(bar, tqdm.tqdm)
        bar.update(4)
    assert "work: 100%" in out.getvalue() and "4/4 [" in out.getvalue() and " records/s]" in out.getvalue(), \
        out.getvalue()


def test_pack_shows_progress_on_request(no_tqdm, tmp_path, monkeypatch, capsys):
    src = tmp_path / "lines.txt"
    src.write_text("".join(f"line {i}\n" for i in range(25)))
    monkeypatch.delenv("PYBRIDGE_PROGRESS", raising=False)
    assert recordio_main(["pack", "--lines", str(src), "-o", str(tmp_path / "a"), "-n", "10"]) == 0
    assert capsys.readouterr().err == ""  # stderr is not a terminal here
    monkeypatch.setenv("PYBRIDGE_PROGRESS", "1")
    assert recordio_main(["pack", "--lines", str(src), "-o", str(tmp_path / "b"), "-n", "10"]) == 0
    assert capsys.readouterr().err.endswith("\rpybridge-recordio pack: 25 records\n")


def test_prepare_shows_each_long_step(no_tqdm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYBRIDGE_PROGRESS", "1")
    assert prepare.main(["--out", str(tmp_path / "d"), "--train-count", "30", "--test-count", "10"]) == 0
    err = capsys.readouterr().err
    for line in ("prepare: synthetic train: 30/30 images (100%)", "prepare: synthetic test: 10/10 images (100%)",
                 "prepare: writing train: 30/30 records (100%)", "prepare: writing test: 10/10 records (100%)"):
        assert "\r" + line + "\n" in err, err
