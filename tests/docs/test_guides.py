"""The three extension guides run as written: each page's ```python blocks execute in order, in one namespace.

A guide that no longer runs (a renamed function, a changed shape) fails here, so the pages stay a working
example. The registries a guide adds to (families, methods) are restored afterwards, so that no other test
sees the guide's method or family.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
GUIDES = ("extending/method.md", "extending/family.md", "extending/causal.md")
_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def python_blocks(text: str) -> list[str]:
    """The fenced ```python blocks of a Markdown page, in order."""
    return _BLOCK.findall(text)


def test_python_blocks_are_found_in_order():
    page = "intro\n```python\na = 1\n```\ntext\n```bash\nls\n```\n```python\nb = a + 1\n```\n"
    assert python_blocks(page) == ["a = 1\n", "b = a + 1\n"]


@pytest.fixture
def registries(monkeypatch):
    """The family and method registries as they were before the test, whatever the guide registers."""
    import vitviz.models.families as families
    from vitviz.methods import METHODS

    monkeypatch.setattr(families, "_BY_TYPE", dict(families._BY_TYPE))
    monkeypatch.setattr(families, "FAMILIES", families.FAMILIES)
    saved = dict(METHODS)
    try:
        yield
    finally:
        METHODS.clear()
        METHODS.update(saved)


@pytest.mark.slow
@pytest.mark.parametrize("guide", GUIDES)
def test_guide_runs(guide, registries, one_thread, tmp_path, monkeypatch):
    blocks = python_blocks((DOCS / guide).read_text(encoding="utf-8"))
    assert len(blocks) >= 3, f"{guide} should show its example in steps"
    monkeypatch.chdir(tmp_path)  # a guide writes its files (a tiny checkpoint) in the working directory
    namespace: dict = {"__name__": f"guide_{Path(guide).stem}"}
    for i, block in enumerate(blocks):
        code = compile(block, f"{guide} block {i + 1}", "exec")
        exec(code, namespace)  # the page's own example: running it is the point of the test
