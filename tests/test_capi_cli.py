"""pybridge-capi (python -m pybridge.capi) without building: the queries, their error when
nothing is built, and `check`'s verdict on PKG_CONFIG_PATH. The build itself is exercised by
make (capi/build.py) and by test_outside_install.py."""

import os

import pytest

from pybridge.cbuild import cli as cli
from pybridge.cbuild.library import write_pc


def fake_prefix(root):
    """A prefix laid out as `build --prefix` leaves it (empty files for header and library)."""
    d = cli.layout(root)
    for folder, name in ((d["include"], "pybridge.h"), (d["lib"], "libpybridge.so")):
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, name), "w").close()
    write_pc(os.path.join(d["pkgconfig"], "pybridge.pc"), None, None, prefix=d["prefix"])
    return d


def test_queries_print_flags_of_the_prefix(tmp_path, capsys):
    d = fake_prefix(tmp_path / "p")
    assert cli.main(["--pkg-config-path", "--prefix", str(tmp_path / "p")]) == 0
    assert capsys.readouterr().out == d["pkgconfig"] + "\n"
    assert cli.main(["--cflags", "--libs", "--prefix", str(tmp_path / "p")]) == 0
    assert capsys.readouterr().out.split() == [f"-I{d['include']}", f"-L{d['lib']}", "-lpybridge",
                                               f"-Wl,-rpath,{d['lib']}"]
    # The .pc file says the same to pkg-config.
    v = cli.pc_variables(os.path.join(d["pkgconfig"], "pybridge.pc"))
    assert (v["libdir"], v["includedir"]) == (d["lib"], d["include"])


def test_go_dir_is_the_packaged_go_module(tmp_path, capsys):
    assert cli.main(["--go-dir", "--prefix", str(tmp_path / "nothing built")]) == 0
    go_dir = capsys.readouterr().out.strip()
    assert go_dir == os.path.join(os.path.dirname(os.path.dirname(cli.__file__)), "go")  # pybridge/go
    with open(os.path.join(go_dir, "go.mod")) as f:
        assert f.readline().strip() == "module github.com/pybridge/pybridge/go"


def test_query_before_build_says_what_to_run(tmp_path, capsys):
    assert cli.main(["--libs", "--prefix", str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err
    assert "pybridge.pc does not exist" in err and f"build --prefix {tmp_path / 'nothing'}" in err


@pytest.mark.parametrize("argv", [[], ["build", "--libs"], ["nonesuch"]])
def test_bad_command_lines(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_check_names_each_mistake(tmp_path, monkeypatch):
    d = fake_prefix(tmp_path / "p")
    pc = os.path.join(d["pkgconfig"], "pybridge.pc")
    assert cli.check_pkg_config_path(d["pkgconfig"]) == (pc, [])
    assert cli.check_pkg_config_path("/nonexistent" + os.pathsep + d["pkgconfig"]) == (pc, [])

    found, problems = cli.check_pkg_config_path(None)
    assert found is None and "PKG_CONFIG_PATH is not set" in problems[0]

    monkeypatch.chdir(tmp_path / "p" / "lib")
    found, problems = cli.check_pkg_config_path("pkgconfig")  # right folder, but relative
    assert found is None
    assert "'pkgconfig' is relative" in problems[0] and d["pkgconfig"] in problems[0], problems
    assert "no pybridge.pc in any absolute PKG_CONFIG_PATH folder" in problems[1]

    os.remove(os.path.join(d["lib"], "libpybridge.so"))
    found, problems = cli.check_pkg_config_path(d["pkgconfig"])
    assert found == pc and problems == [f"{pc} names {d['lib']}/libpybridge.so, which does not exist: "
                                        "build again (pybridge-capi build)"]


def test_check_command_exit_status(tmp_path, monkeypatch, capsys):
    d = fake_prefix(tmp_path / "p")
    monkeypatch.setenv("PKG_CONFIG_PATH", d["pkgconfig"])
    assert cli.main(["check"]) == 0
    assert f"pkg-config finds {d['pkgconfig']}/pybridge.pc" in capsys.readouterr().out
    monkeypatch.setenv("PKG_CONFIG_PATH", "build")
    assert cli.main(["check"]) == 1
    assert "'build' is relative" in capsys.readouterr().err


def test_build_failures_name_the_cause(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    assert cli.main(["build", "--prefix", str(tmp_path / "p")]) == 1
    err = capsys.readouterr().err
    assert "pybridge-capi: compiling libpybridge.so failed" in err and "needs a C compiler" in err, err
    assert not os.path.exists(tmp_path / "p" / "lib" / "libpybridge.so")

    monkeypatch.delenv("CC")
    (tmp_path / "file").write_text("")
    assert cli.main(["build", "--prefix", str(tmp_path / "file")]) == 1  # a file, not a folder
    assert f"pybridge-capi: cannot write under {tmp_path / 'file'}" in capsys.readouterr().err


def test_torch_cflags_without_headers_says_so(monkeypatch, capsys):
    """A torch installed without its C++ headers: --torch-cflags names the folder and exits 1
    rather than printing flags that fail in the compiler."""
    from torch.utils import cpp_extension
    assert cli.main(["--torch-cflags"]) == 0 and "-I" in capsys.readouterr().out
    monkeypatch.setattr(cpp_extension, "include_paths", lambda *a, **k: ["/nonexistent/torch/include"])
    assert cli.main(["--torch-cflags"]) == 1
    err = capsys.readouterr().err
    assert "has no C++ headers" in err and "/nonexistent/torch/include" in err
