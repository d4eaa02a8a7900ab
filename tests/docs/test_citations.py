"""Every definition the code cites is in docs/, under the anchor cited; the team's internal notes are never cited.

The code, the app and the tests cite a definition as ``docs/definitions.md#attention-rollout`` (a page and a
heading's anchor, as MkDocs makes it); the app, whose users may not have the repository, names it as
"vitviz docs, Definitions > Attention rollout" (a page's title, then a heading). Both must resolve. The
internal file the definitions once lived in must not be cited anywhere.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import markdown

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CODE = ("vitviz", "ui", "pages", "app.py", "tests", "benchmarks", "README.md")
_CITE = re.compile(r"docs/((?:[\w-]+/)*[\w-]+\.md)(?:#([\w-]+))?")
_NAMED = re.compile(r"vitviz docs, ([A-Z][\w &-]*?) > ([A-Z][\w ,()'&/-]*?)(?=[.;:\")\]]|$)", re.MULTILINE)
_INTERNAL = "ALGORITHMS" + ".md"  # spelled in two parts so that this file does not cite it


@cache
def headings(page: str) -> tuple[str, dict[str, str]]:
    """A docs page's title (its first heading) and its headings' anchors -> their text, as MkDocs renders them
    (Python-Markdown's ``toc`` slugs, ``{#id}`` from ``attr_list``)."""
    md = markdown.Markdown(extensions=["toc", "attr_list", "tables", "admonition", "pymdownx.superfences"])
    md.convert((DOCS / page).read_text(encoding="utf-8"))
    found: dict[str, str] = {}

    def walk(tokens) -> None:
        for t in tokens:
            found[t["id"]] = t["name"]
            walk(t["children"])

    walk(md.toc_tokens)
    return (md.toc_tokens[0]["name"] if md.toc_tokens else ""), found


def files(*roots: str) -> list[Path]:
    """Tracked and untracked (not ignored) text files under ``roots``."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *roots],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    out = []
    for name in dict.fromkeys(filter(None, listed)):
        path = ROOT / name
        if path.is_file() and path.suffix in {".py", ".md", ".toml", ".yml", ".yaml", ".txt", ".ipynb", ".cfg", ""}:
            out.append(path)
    return out


def test_headings_are_read_as_mkdocs_makes_anchors():
    title, anchors = headings("definitions.md")
    assert title == "Definitions"
    assert anchors["attention-rollout"] == "Attention rollout"  # explicit {#...} anchors
    assert "rollout-through-stages" in anchors  # a level-3 heading


def test_the_internal_notes_are_cited_nowhere():
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in files(".")
        for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if _INTERNAL in line
    ]
    assert not hits, f"{_INTERNAL} is internal: cite the docs page instead ({', '.join(hits)})"


def test_every_cited_docs_anchor_exists():
    cited = 0
    bad = []
    for path in files(*CODE):
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in _CITE.finditer(text):
            page, anchor = m.group(1), m.group(2)
            where = f"{path.relative_to(ROOT)}: docs/{page}" + (f"#{anchor}" if anchor else "")
            cited += 1
            if not (DOCS / page).is_file():
                bad.append(f"{where} (no such page)")
            elif anchor and anchor not in headings(page)[1]:
                bad.append(f"{where} (no such anchor)")
    assert not bad, "\n".join(bad)
    assert cited >= 20  # the code cites its definitions (a parser that finds nothing would pass vacuously)


def test_every_named_definition_in_the_app_exists():
    titles = {headings(p.relative_to(DOCS).as_posix())[0]: p for p in DOCS.rglob("*.md")}
    named = 0
    bad = []
    for path in files("vitviz", "ui", "pages", "app.py"):
        for m in _NAMED.finditer(path.read_text(encoding="utf-8", errors="replace")):
            title, heading = m.group(1).strip(), m.group(2).strip()
            named += 1
            page = titles.get(title)
            if page is None:
                bad.append(f"{path.relative_to(ROOT)}: no docs page titled {title!r}")
            elif heading not in headings(page.relative_to(DOCS).as_posix())[1].values():
                bad.append(f"{path.relative_to(ROOT)}: {title} has no heading {heading!r}")
    assert not bad, "\n".join(bad)
    assert named >= 1
