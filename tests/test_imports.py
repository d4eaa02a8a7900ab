"""Layers import downward only, and the light layers import without torch.

The import graph is read from the source with ``ast``: every ``import`` / ``from ... import`` of a
project module, at module level and inside functions (a function-level import is still a dependency,
only a later one), but not those under ``if TYPE_CHECKING:`` (annotations only, never run). Two graphs
must have no cycle:

* subpackages of ``vitviz`` (``vitviz.capture``, ``vitviz.models``, ...; a top-level module such as
  ``vitviz.record`` or ``vitviz.errors`` is a node of its own);
* modules of ``vitviz`` and of ``benchmarks`` (catches a circle inside one subpackage too).

A failure names the circle, each link with the file and line of the import that makes it.
"""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vitviz", "benchmarks")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_edges(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, dict[str, str]]:
    """``{importer: {imported module: "file:line"}}`` for imports between modules of ``packages`` under ``root``.

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``; relative imports
    are resolved; imports under ``if TYPE_CHECKING:`` are left out (their ``else:`` branch is kept).
    """
    files = {_module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    edges: dict[str, dict[str, str]] = {m: {} for m in files}

    for name, path in files.items():
        is_pkg = path.name == "__init__.py"
        here = edges[name]
        where = path.relative_to(root).as_posix()

        def add(target: str, line: int, here=here, where=where) -> None:
            while target and target not in files:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target.split(".")[0] in packages:
                here.setdefault(target, f"{where}:{line}")

        class Visitor(ast.NodeVisitor):
            def visit_If(self, node: ast.If) -> None:
                if _is_type_checking(node.test):
                    for child in node.orelse:
                        self.visit(child)
                else:
                    self.generic_visit(node)

            def visit_Import(self, node: ast.Import) -> None:
                for alias in node.names:
                    add(alias.name, node.lineno)

            def visit_ImportFrom(self, node: ast.ImportFrom, name=name, is_pkg=is_pkg) -> None:
                if node.level:
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                for alias in node.names:
                    add(f"{module}.{alias.name}", node.lineno)

        Visitor().visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return edges


def subpackage(module: str) -> str:
    """``vitviz.capture.forward`` -> ``vitviz.capture``; ``vitviz.errors`` -> itself; ``vitviz`` -> itself."""
    return ".".join(module.split(".")[:2])


def collapse(edges: dict[str, dict[str, str]], key) -> dict[str, dict[str, str]]:
    """The graph between ``key(module)`` groups (edges inside one group dropped), first import seen per link."""
    out: dict[str, dict[str, str]] = {}
    for a, targets in edges.items():
        for b, where in targets.items():
            ka, kb = key(a), key(b)
            out.setdefault(ka, {})
            out.setdefault(kb, {})
            if ka != kb:
                out[ka].setdefault(kb, where)
    return out


def cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """One circle ``[a, b, ..., a]`` per strongly connected component with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[set[str]] = []

    def visit(v: str) -> None:  # the graphs are a few hundred nodes: recursion is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)

    found = []
    for comp in comps:  # a shortest circle through the component's first node (breadth first)
        start = min(comp)
        parent = {start: None}
        queue = [start]
        end = None
        while queue and end is None:
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w not in comp:
                    continue
                if w == start:
                    end = v
                    break
                if w not in parent:
                    parent[w] = v
                    queue.append(w)
        back = [start]  # start <- end <- ... <- start, read backwards
        while end is not None:
            back.append(end)
            end = parent[end]
        found.append([*back[::-1][:-1], start] if len(back) > 1 else back)
    return found


def _reach(graph: dict[str, dict[str, str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for w in graph.get(todo.pop(), {}):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def describe(circle: list[str], graph: dict[str, dict[str, str]]) -> str:
    """The circle's links with the import that makes each, and the other nodes caught in the same knot."""
    links = [f"{a} -> {b} ({graph[a][b]})" for a, b in itertools.pairwise(circle)]
    knot = {v for v in _reach(graph, circle[0]) if circle[0] in _reach(graph, v)} - set(circle)
    also = f" [also in this knot: {', '.join(sorted(knot))}]" if knot else ""
    return "import cycle: " + "; ".join(links) + also


def test_no_cycle_between_subpackages():
    graph = collapse(import_edges(ROOT), subpackage)
    found = [describe(c, graph) for c in cycles(graph)]
    assert not found, "\n".join(found)


def test_no_cycle_between_modules():
    edges = import_edges(ROOT)
    graph = {a: dict(t) for a, t in edges.items()}
    found = [describe(c, graph) for c in cycles(graph)]
    assert not found, "\n".join(found)


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def test_checker_finds_function_level_and_relative_cycles_and_skips_type_checking(tmp_path):
    _write(tmp_path, "vitviz/__init__.py", "")
    _write(tmp_path, "vitviz/low/__init__.py", "")
    _write(tmp_path, "vitviz/low/a.py", "from vitviz.errors import E\n")
    _write(tmp_path, "vitviz/errors.py", "")
    _write(tmp_path, "vitviz/high/__init__.py", "")
    _write(tmp_path, "vitviz/high/b.py", "from ..low import a\n")  # downward: fine
    _write(
        tmp_path,
        "vitviz/low/c.py",
        """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from vitviz.high.b import Thing  # annotations only: not an edge
        """,
    )
    graph = collapse(import_edges(tmp_path, ("vitviz",)), subpackage)
    assert cycles(graph) == []
    assert graph["vitviz.high"] == {"vitviz.low": "vitviz/high/b.py:1"}

    _write(tmp_path, "vitviz/low/d.py", "def f():\n    from vitviz.high import b\n")  # upward, in a function
    graph = collapse(import_edges(tmp_path, ("vitviz",)), subpackage)
    assert cycles(graph) == [["vitviz.high", "vitviz.low", "vitviz.high"]]
    message = describe(cycles(graph)[0], graph)
    assert "vitviz.low -> vitviz.high (vitviz/low/d.py:2)" in message
    assert "vitviz.high -> vitviz.low (vitviz/high/b.py:1)" in message

    modules = import_edges(tmp_path, ("vitviz",))  # high.b -> low.a, low.d -> high.b: no circle of modules
    assert cycles(modules) == []
    _write(tmp_path, "vitviz/low/a.py", "import vitviz.low.d\n")
    assert cycles(import_edges(tmp_path, ("vitviz",))) == [
        ["vitviz.high.b", "vitviz.low.a", "vitviz.low.d", "vitviz.high.b"]
    ]


def _fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def module_level_imports(root: Path) -> dict[str, set[str]]:
    """``{vitviz module: every module its top level imports}`` (absolute names; function bodies and
    ``if TYPE_CHECKING:`` left out): what importing the module runs at once."""
    out: dict[str, set[str]] = {}
    for path in sorted((root / "vitviz").rglob("*.py")):
        name = _module_name(path, root)
        is_pkg = path.name == "__init__.py"
        found: set[str] = set()

        def visit(body, found=found, name=name, is_pkg=is_pkg) -> None:
            for node in body:
                if isinstance(node, ast.Import):
                    found.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                        mod = ".".join([*base, *([node.module] if node.module else [])])
                    else:
                        mod = node.module or ""
                    found.add(mod)
                    found.update(f"{mod}.{a.name}" for a in node.names)
                elif isinstance(node, ast.If):
                    if not _is_type_checking(node.test):
                        visit(node.body)
                    visit(node.orelse)
                elif isinstance(node, ast.Try):
                    visit(node.body)
                    for h in node.handlers:
                        visit(h.body)
                    visit(node.orelse)
                    visit(node.finalbody)

        visit(ast.parse(path.read_text()).body)
        out[name] = found
    return out


def _closure(start: str, imports: dict[str, set[str]]) -> set[str]:
    """Every module importing ``start`` runs at once: its top-level imports, followed through vitviz's modules and
    the packages above them."""
    seen, stack, external = set(), [start], set()
    while stack:
        mod = stack.pop()
        parts = mod.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
            name = ".".join(parts[:i])
            if name in imports and name not in seen:
                seen.add(name)
                stack.extend(imports[name])
            elif name not in imports and parts[0] != "vitviz":
                external.add(parts[0])
    return external


def test_analysis_and_figures_import_without_torch():
    """Statically: no module of vitviz.analysis or vitviz.figures imports torch, transformers or Streamlit when
    imported (directly or through the vitviz modules it imports); a function may import them when it runs."""
    imports = module_level_imports(ROOT)
    starts = [m for m in imports if m.startswith(("vitviz.analysis", "vitviz.figures"))]
    assert len(starts) > 10
    bad = {m: sorted(_closure(m, imports) & {"torch", "transformers", "streamlit"}) for m in starts}
    bad = {m: heavy for m, heavy in bad.items() if heavy}
    assert not bad, bad


def test_the_static_check_sees_a_heavy_import_through_another_module(tmp_path):
    _write(tmp_path, "vitviz/__init__.py", "")
    _write(tmp_path, "vitviz/analysis/__init__.py", "from vitviz.analysis import a\n")
    _write(tmp_path, "vitviz/analysis/a.py", "import numpy\nfrom vitviz import b\n")
    _write(tmp_path, "vitviz/b.py", "def f():\n    import transformers\nimport torch.nn\n")
    imports = module_level_imports(tmp_path)
    assert _closure("vitviz.analysis.a", imports) == {"numpy", "torch"}
    _write(tmp_path, "vitviz/b.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n")
    assert _closure("vitviz.analysis.a", module_level_imports(tmp_path)) == {"numpy", "typing"}


def test_import_vitviz_is_lazy_and_keeps_its_names():
    done = _fresh("import sys, vitviz; assert 'torch' not in sys.modules, 'torch'; print(' '.join(vitviz.__all__))")
    assert done.returncode == 0, done.stderr
    names = done.stdout.split()
    assert {"load_model", "Capture", "rollout_matrix", "VitvizError", "explain_classes"} <= set(names)
    code = (
        "import vitviz\n"
        "for n in vitviz.__all__:\n"
        "    obj = getattr(vitviz, n)\n"
        "    assert getattr(obj, '__name__', n) == n, n\n"
        "assert set(vitviz.__all__) <= set(dir(vitviz))\n"
        "from vitviz import load_model, Capture\n"
        "try:\n"
        "    vitviz.no_such_name\n"
        "except AttributeError as e:\n"
        "    assert 'no_such_name' in str(e)\n"
        "else:\n"
        "    raise SystemExit('no AttributeError')\n"
    )
    done = _fresh(code)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("module", ["vitviz.record", "vitviz.errors"])
def test_bottom_layer_imports_only_numpy(module):
    done = _fresh(
        f"import sys, {module}\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'PIL', 'plotly') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    assert done.returncode == 0, done.stderr
