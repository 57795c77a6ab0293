"""How much of pybridge is annotated and documented: `python tests/typing/coverage.py [-v]`.

Counts public functions by reading the source (ast; nothing is imported): functions and
methods whose name and enclosing names do not start with "_" (`__init__` counts, as its
class's constructor), in modules whose path has no private part. "Annotated": every parameter
but self/cls and the return; "documented": a docstring (a class's counts for its __init__).
Printed for the whole package, for the typed modules (pyproject.toml's [tool.mypy] list), and
with -v per subpackage.
"""

import ast
import os
import sys
import tomllib
from collections import Counter
from typing import Union

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_Def = Union[ast.FunctionDef, ast.AsyncFunctionDef]


def typed_modules() -> set[str]:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        overrides = tomllib.load(f)["tool"]["mypy"]["overrides"]
    return {m for o in overrides if o.get("ignore_errors") is False for m in o["module"]}


def _annotated(fn: _Def) -> bool:
    a = fn.args
    params = a.posonlyargs + a.args + a.kwonlyargs
    if params and params[0].arg in ("self", "cls"):
        params = params[1:]
    every = params + [p for p in (a.vararg, a.kwarg) if p is not None]
    return fn.returns is not None and all(p.annotation is not None for p in every)


def _part_of_another(fn: _Def) -> bool:
    """An @overload stub, or a property's setter: parts of the function (the property) they name."""
    return any(isinstance(d, (ast.Name, ast.Attribute)) and ast.unparse(d).endswith(("overload", ".setter"))
               for d in fn.decorator_list)


def _public(node: Union[ast.Module, ast.ClassDef], parent: Union[ast.Module, ast.ClassDef]) -> list[tuple[_Def, bool]]:
    """(function, documented) of every public function under `node`."""
    out = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
            out += _public(child, child)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _part_of_another(child) and \
                (not child.name.startswith("_") or child.name == "__init__"):
            doc = ast.get_docstring(child) or (child.name == "__init__" and ast.get_docstring(parent))
            out.append((child, bool(doc)))
    return out


def count(missing: list[str]) -> dict[str, Counter[str]]:
    """{subpackage or module: Counter(total, annotated, documented)}, plus "typed" and "all";
    the typed modules' undocumented functions are appended to `missing`."""
    typed = typed_modules()
    rows: dict[str, Counter[str]] = {"all": Counter(), "typed": Counter()}
    package = os.path.join(ROOT, "pybridge")
    for folder, _, files in os.walk(package):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), package)
            parts = rel[:-3].split(os.sep)
            if any(p.startswith("_") and p not in ("__init__", "__main__") for p in parts):
                continue
            module = ".".join(["pybridge"] + [p for p in parts if p != "__init__"])
            with open(os.path.join(folder, name)) as f:
                tree = ast.parse(f.read())
            group = parts[0] if len(parts) > 1 else rel
            for fn, documented in _public(tree, tree):
                for key in ("all", group) + (("typed",) if module in typed else ()):
                    row = rows.setdefault(key, Counter())
                    row["total"] += 1
                    row["annotated"] += _annotated(fn)
                    row["documented"] += documented
                if module in typed and not documented:
                    missing.append(f"{module}: {fn.name} (line {fn.lineno})")
    return rows


def _line(name: str, row: Counter[str]) -> str:
    n = row["total"] or 1
    return (f"{name:<22} {row['total']:4} public functions, {row['annotated']:4} annotated "
            f"({100 * row['annotated'] // n:3}%), {row['documented']:4} documented ({100 * row['documented'] // n:3}%)")


def main(argv: list[str]) -> None:
    missing: list[str] = []
    rows = count(missing)
    print(_line("pybridge", rows.pop("all")))
    print(_line("typed modules", rows.pop("typed")))
    if "-v" in argv:
        for name in sorted(rows):
            print(_line("  " + name, rows[name]))
        print("undocumented in the typed modules:", *missing, sep="\n  ")


if __name__ == "__main__":
    main(sys.argv[1:])
