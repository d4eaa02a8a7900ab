"""House rule: the engine never imports the UI."""

import ast
import re
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "vitviz"


def test_vitviz_never_imports_streamlit():
    for path in ENGINE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n.split(".")[0] == "streamlit" for n in names), f"{path.name} imports streamlit"


def test_no_remote_code_anywhere():
    remote_code = re.compile(r"trust_remote_code\s*=\s*True")
    root = ENGINE.parent
    for path in [
        *root.glob("*.py"),
        *ENGINE.rglob("*.py"),
        *(root / "pages").glob("*.py"),
        *(root / "ui").glob("*.py"),
    ]:
        assert not remote_code.search(path.read_text()), path


def test_pages_holds_the_page_scripts_only():
    """Streamlit lists every file of ``pages/`` as a page until the app's navigation runs: nothing else lives there,
    and every script there is a page of the navigation (the app's library is ``ui/``)."""
    from ui.navigation import PAGES

    root = ENGINE.parent
    on_disk = {f"pages/{p.name}" for p in (root / "pages").iterdir() if p.name != "__pycache__"}
    assert on_disk == {p.script for p in PAGES}


def test_the_navigation_comes_before_the_engine_in_app_py():
    """app.py draws the navigation before importing anything heavy, so a first visit after a server start shows
    the app's own pages while torch is still being imported."""
    tree = ast.parse((ENGINE.parent / "app.py").read_text())
    order = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            order += [("import", m) for m in mods]
        elif "navigation()" in ast.unparse(node):
            order.append(("navigation", ""))
    nav = order.index(("navigation", ""))
    before = [m for kind, m in order[:nav] if kind == "import"]
    assert before and all(m == "streamlit" or m.startswith(("ui.navigation", "__future__")) for m in before), before


def _family_forward_calls(path: Path) -> list[int]:
    """Lines where ``path`` calls a family adapter's ``forward`` (``fam.forward(...)``, ``loaded.family.forward``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "forward":
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if name in ("fam", "family"):
                lines.append(node.lineno)
    return lines


def test_one_module_calls_the_models_forward():
    """Every forward pass of a loaded model goes through vitviz.capture.forward (``run_forward`` with a recorder,
    ``forward_output`` without): one place where a model runs, whatever reads it (the Run, the methods, the
    evaluation's batched path, AttnLRP's rule copy)."""
    callers = {
        path.relative_to(ENGINE.parent).as_posix() for path in ENGINE.rglob("*.py") if _family_forward_calls(path)
    }
    assert callers == {"vitviz/capture/forward.py"}, callers


def test_the_forward_call_check_finds_a_call(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("def f(loaded, x):\n    return loaded.family.forward(loaded.model, x)\n")
    assert _family_forward_calls(src) == [2]


def test_pages_ask_capabilities_not_family_names():
    """A page asks the adapter what it can do (``sampled_keys``, ``block_note``, ...), never which family it is."""
    bad = []
    for path in [*(ENGINE.parent / "pages").glob("*.py"), *(ENGINE.parent / "ui").glob("*.py")]:
        text = path.read_text()
        bad += [f"{path.name}: {m.group(0)}" for m in re.finditer(r"family\.name\s*(==|!=|in\b)", text)]
    assert not bad, bad
