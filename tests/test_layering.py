"""docs/developing.md's layering is the code's: every import between our packages is one the table allows,
no two modules import each other (directly or around a loop), and the page names only files that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "developing.md"


def allowed() -> dict[str, set[str]]:
    block = re.search(r"```layering\n(.*?)```", DOC.read_text(), re.S)
    assert block, "docs/developing.md has no ```layering table"
    table = {}
    for line in block.group(1).strip().splitlines():
        pkg, *deps = line.split()
        table[pkg] = {d for d in deps if d != "-"}
    return table


def modules(packages) -> dict[str, Path]:
    out = {}
    for pkg in packages:
        for f in (ROOT / pkg).rglob("*.py"):
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `path` imports anywhere in it (module level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def test_every_import_between_packages_is_one_the_doc_allows():
    table = allowed()
    mods = modules(table)
    assert {m.split(".")[0] for m in mods} == set(table), "the table names exactly the top-level packages"
    wrong = []
    for name, path in mods.items():
        pkg = name.split(".")[0]
        for dep in imports(path, mods):
            top = dep.split(".")[0]
            if top != pkg and top not in table[pkg]:
                wrong.append(f"{path.relative_to(ROOT)} imports {dep} ({pkg} may import: {sorted(table[pkg]) or 'nothing'})")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle_between_modules():
    mods = modules(allowed())
    graph = {name: imports(path, mods) - {name} for name, path in mods.items()}
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def test_the_doc_names_only_files_that_exist():
    text = DOC.read_text()
    cited = set(re.findall(r"(?<![\w./<>-])([A-Za-z][\w-]*(?:/[\w.-]+)+\.(?:py|md|yaml|sh|c))(?!\w)", text))
    assert len(cited) >= 4  # the pattern still finds the page's paths
    missing = sorted(c for c in cited if not (ROOT / c).exists())
    assert not missing, f"docs/developing.md cites files that do not exist: {missing}"


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):  # TYPE_CHECKING blocks, optional imports
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in sub.names}
                elif isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Assign):
                    names |= {n.id for t in sub.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_every_import_of_our_modules_names_something_that_exists():
    """`from pkg.mod import name` anywhere (in functions too, which only run late: a moved module would
    otherwise fail in the middle of a run): `pkg.mod` is a module and `name` a submodule or defined in it."""
    table = allowed()  # read once: it is looked up for every import below
    mods = modules(table)
    files = [*mods.values(), *(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    defined: dict[str, set[str]] = {}
    wrong = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                top = node.module.split(".")[0]
                if top not in table:
                    continue
                if node.module not in mods:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: no module {node.module}")
                    continue
                if node.module not in defined:
                    defined[node.module] = _top_level_names(mods[node.module])
                for alias in node.names:
                    if alias.name != "*" and alias.name not in defined[node.module] \
                            and f"{node.module}.{alias.name}" not in mods:
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module} has no {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in table and alias.name not in mods:
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: no module {alias.name}")
    assert not wrong, "\n".join(wrong)
