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
    for path in [*root.glob("*.py"), *ENGINE.rglob("*.py"), *(root / "pages").glob("*.py")]:
        assert not remote_code.search(path.read_text()), path
