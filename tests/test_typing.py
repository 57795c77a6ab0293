"""The typed public API: every public function of a typed module is annotated, the names users
import come from typed modules, and the examples in their docstrings run.

The typed modules are the ones pyproject.toml's mypy settings check strictly (the override with
`ignore_errors = false`); `make typecheck` (part of `make test`) runs mypy --strict on them and on
tests/typing/usage.py. This file needs no mypy: it reads the same list, and fails when a public
function of one of those modules loses an annotation (mypy would say so too, but only where it
runs), when a name users import comes from a module not in the list (unless PENDING says why),
and when a docstring example stops working.

Docstring examples are doctests under an `Example::` line, as torch's hooks have them. They run
on 2 ranks in one process per rank (tests/ranks.py), in the order they are found, each docstring
in a fresh namespace and a folder of its own: a docstring whose code calls `pybridge.init(` (a
comment that names it does not count) makes its own world (a world left from before is finalized
first, and its own after it), every other one finds a world made for it. An example
that cannot run in such a world (a launcher, a second node) says `# doctest: +SKIP` and is
compiled only.
"""

import doctest
import importlib
import importlib.util
import inspect
import os
import io
import re
import tokenize
import tomllib

import pytest

from ranks import free_port, run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def typed_modules():
    """The modules pyproject.toml's mypy settings check strictly."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        overrides = tomllib.load(f)["tool"]["mypy"]["overrides"]
    return sorted(m for o in overrides if o.get("ignore_errors") is False for m in o["module"])


TYPED = typed_modules()

# Public names whose module is not typed yet, and why. The test fails for a name that is typed
# and still listed here, so the list only shrinks.
PENDING: dict[str, str] = {}  # every public module is typed now

# The subpackages whose public names (__all__) users import, besides `pybridge` itself.
PACKAGES = ("pybridge", "pybridge.ddp", "pybridge.recordio", "pybridge.launch", "pybridge.federated")

# What a user calls first: each has an `Example::` in its docstring (pending ones excepted).
FIRST = (
    "pybridge.all_reduce", "pybridge.broadcast", "pybridge.barrier", "pybridge.all_gather",
    "pybridge.DistributedDataParallel", "pybridge.Reducer", "pybridge.broadcast_parameters", "pybridge.split",
    "pybridge.env", "pybridge.init", "pybridge.finalize",
    "pybridge.recordio.Writer", "pybridge.recordio.Reader", "pybridge.recordio.Loader",
    "pybridge.recordio.write_file", "pybridge.recordio.read_file",
    "pybridge.runtime.checkpoint.save", "pybridge.runtime.checkpoint.restore",
    "pybridge.launch.main", "pybridge.observe.start", "pybridge.observe.span",
    "pybridge.algorithms.default_hooks.allreduce_hook", "pybridge.algorithms.default_hooks.fp16_compress_hook",
    "pybridge.algorithms.default_hooks.bf16_compress_hook", "pybridge.algorithms.default_hooks.powersgd_hook",
    "pybridge.algorithms.gossip.GossipState", "pybridge.algorithms.hierarchical.HierarchicalState",
    "pybridge.algorithms.local_sgd.PeriodicModelAverager",
    "pybridge.runtime.elastic.State",
)
EXAMPLE = re.compile(r"^Example[^\n]*::$", re.M)  # "Example::", or "Example (how it is used)::"


def _resolve(dotted):
    """The object a dotted name names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(dotted)


def _public_functions(module):
    """(qualified name, function) of every public function the module defines, and every public
    method (and __init__) of its public classes."""
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    for name in names:
        obj = getattr(module, name)
        if getattr(obj, "__module__", None) != module.__name__:
            continue  # imported, not defined here
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                fn = member.fget if isinstance(member, property) else member
                fn = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
                if inspect.isfunction(fn) and fn.__module__ == module.__name__:  # not typing's Protocol.__init__
                    yield f"{name}.{attr}", fn


def _missing_annotations(fn):
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):
        params = params[1:]
    missing = [p.name for p in params if p.annotation is inspect.Parameter.empty]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


@pytest.mark.parametrize("module", TYPED)
def test_every_public_function_of_a_typed_module_is_annotated(module):
    mod = importlib.import_module(module)
    bad = [f"{module}.{name}: {', '.join(missing)}" for name, fn in _public_functions(mod)
           if (missing := _missing_annotations(fn))]
    assert not bad, "public functions without annotations (parameters or return):\n" + "\n".join(bad)


def test_the_names_users_import_come_from_typed_modules():
    bad, done = [], []
    for package in PACKAGES:
        pkg = importlib.import_module(package)
        for name in pkg.__all__:
            obj = getattr(pkg, name)
            home = getattr(obj, "__module__", None)
            if home is None or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue  # a constant
            if home in PENDING:
                continue
            if home not in TYPED:
                bad.append(f"{package}.{name} (defined in {home})")
    done = [m for m in PENDING if m in TYPED]
    assert not bad, "public names from modules mypy does not check (add the module to pyproject.toml's " \
                    "typed list, annotated):\n" + "\n".join(bad)
    assert not done, f"typed now, so no longer pending: {done}"


def test_the_package_re_exports_its_names_for_type_checkers():
    """pybridge/__init__.py's TYPE_CHECKING imports are `X as X`: a user's checker in strict mode (no
    implicit re-export) otherwise refuses `pybridge.all_reduce` (tests/typing/usage.py shows it)."""
    import ast
    tree = ast.parse(open(os.path.join(ROOT, "pybridge", "__init__.py")).read())
    block = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    bare = [a.name for imp in block.body for a in imp.names if a.asname != a.name]
    assert not bare, f"imported without `as` (not re-exported): {bare}"


def test_what_users_call_first_has_an_example():
    bad = [name for name in FIRST if not EXAMPLE.search(inspect.getdoc(_resolve(name)) or "")]
    assert not bad, "no `Example::` in the docstring of: " + ", ".join(bad)


def test_public_hooks_have_an_example():
    """Every hook a user passes to register_comm_hook shows how, as torch's hooks do."""
    from pybridge.algorithms import default_hooks, gossip, hierarchical
    hooks = [default_hooks.allreduce_hook, default_hooks.fp16_compress_hook, default_hooks.bf16_compress_hook,
             default_hooks.powersgd_hook, gossip.gossip_hook, hierarchical.hierarchical_hook]
    bad = [h.__name__ for h in hooks if "register_comm_hook" not in (inspect.getdoc(h) or "")]
    assert not bad, "hooks whose example does not show register_comm_hook: " + ", ".join(bad)


# ---- docstring examples ----------------------------------------------------------------------

def _example_modules():
    """The typed modules and every module defining a FIRST name."""
    homes = {getattr(_resolve(n), "__module__", None) for n in FIRST}
    return sorted((set(TYPED) | homes) - {None})


def _doctests():
    """(id, DocTest) of every docstring with examples in the example modules, in a fixed order."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = []
    for module in _example_modules():
        for test in finder.find(importlib.import_module(module)):
            if test.examples:
                found.append(test)
    return sorted(found, key=lambda t: t.name)


def test_every_docstring_example_compiles():
    tests = _doctests()
    assert len(tests) >= len(FIRST), [t.name for t in tests]  # the finder sees the examples
    for t in tests:
        for ex in t.examples:
            compile(ex.source, f"{t.name} (line {ex.lineno})", "single")


def _calls_init(source):
    """Whether an example's code calls pybridge.init (its comments do not count)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return "pybridge.init(" in "".join(t.string for t in tokens if t.type != tokenize.COMMENT)


def test_an_example_makes_its_own_world_only_when_its_code_calls_init():
    assert _calls_init("w = pybridge.init(backend='gloo')\n")
    assert not _calls_init("model = DDP(net)   # after pybridge.init()\n")
    assert not _calls_init("pybridge.initialize = 1\n")


def _run_examples(rank, world, names, ports, workdir):
    """On each rank: every docstring's examples, in order; a world made for those that need one."""
    import pybridge

    assert pybridge.__file__.startswith(ROOT + os.sep), pybridge.__file__
    tests = {t.name: t for t in _doctests()}
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failures, port, tried = [], iter(ports), 0
    for name in names:
        t = tests[name]
        own = any(_calls_init(ex.source) for ex in t.examples)
        if own and pybridge.is_initialized():
            pybridge.finalize(linger=0)  # it makes its own world
        if not own and not pybridge.is_initialized():
            os.environ["MASTER_PORT"] = str(next(port))
            pybridge.init()
        elif own:
            os.environ["MASTER_PORT"] = str(next(port))
        folder = os.path.join(workdir, f"rank{rank}", re.sub(r"\W", "_", name))
        os.makedirs(folder)
        os.chdir(folder)
        t.globs = {"__name__": "__main__"}
        out = []
        result = runner.run(t, out=out.append, clear_globs=True)
        tried += result.attempted
        if result.failed:
            failures.append("".join(out))
        if own and pybridge.is_initialized():
            pybridge.finalize(linger=0)
    # The typed usage sample, as a program: a short training run on these ranks.
    spec = importlib.util.spec_from_file_location("usage", os.path.join(ROOT, "tests", "typing", "usage.py"))
    usage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(usage)
    folder = os.path.join(workdir, f"rank{rank}", "usage")
    os.makedirs(folder)
    loss = usage.main(folder)
    if pybridge.is_initialized():
        pybridge.finalize(linger=0)
    return tried, failures, loss


def test_docstring_examples_run_on_two_ranks(tmp_path):
    tests = _doctests()
    names = [t.name for t in tests]
    results = run_ranks(_run_examples, 2, names, [free_port() for _ in names], str(tmp_path), timeout=240,
                        env={"LOCAL_WORLD_SIZE": "2", "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])})
    failed = {r: f for r, (_, f, _) in enumerate(results) if f}
    assert not failed, "\n".join(f"--- rank {r}:\n" + "\n".join(f) for r, f in failed.items())
    skipped = sum(1 for t in tests for ex in t.examples if ex.options.get(doctest.SKIP))
    assert [tried for tried, _, _ in results] == [sum(len(t.examples) for t in tests) - skipped] * 2
    losses = [loss for _, _, loss in results]
    assert losses[0] == losses[1] and 0 < losses[0] < 1, losses  # the usage sample trained, averaged over ranks
