"""The manual builds: ``mkdocs build --strict`` (Material theme, mkdocstrings from the docstrings) with no warning.

Strict mode turns every warning into a failure: a page missing from the nav, a link to a page or an anchor
that does not exist, a docstring mkdocstrings cannot read. The site goes to a temporary folder (``site/`` is
never committed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_site_builds_strict_without_warnings(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert not warnings, "\n".join(warnings)
    site = tmp_path / "site"
    for page in ("index.html", "definitions/index.html", "export/index.html", "api/index.html"):
        assert (site / page).is_file(), page
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    for name in (  # mkdocstrings rendered them from the docstrings
        "vitviz.capture.run.get_run",
        "vitviz.models.families.register_family",
        "vitviz.methods.register_method",
        "vitviz.models.load.load_model",
    ):
        assert f'id="{name}"' in api, name


def test_site_output_is_ignored_by_git():
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "site/index.html"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert ignored.returncode == 0, "site/ (mkdocs' default output folder) must be in .gitignore"
