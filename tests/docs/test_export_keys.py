"""docs/export.md names every key the export writes, and the export writes every key it names.

Three exports through the command line's own entry point, with every option: the demo ViT (causal, a
difference target, patching from a second image, every explanation method, a GIF, a query point), the
zero-shot demo CLIP (labels, a label minus another, causal, patching), and a tiny MobileViT (where rollout is
undefined, so ``rollout_note`` replaces ``rollout``).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import save_tiny

from vitviz.__main__ import main
from vitviz.data.shapes import make_sample
from vitviz.methods import METHODS
from vitviz.sae.demo import DEMO_SAE_DIR

PAGE = Path(__file__).resolve().parents[2] / "docs" / "export.md"
_ROW = re.compile(r"^\| `([a-z_0-9<>A-Z]+)` \|", re.MULTILINE)

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]


def documented(text: str) -> dict[str, re.Pattern]:
    """Each key of the page's tables (first column) -> the pattern of the keys it stands for.

    ``query_map_NNN`` stands for ``query_map_000``, ``query_map_001``, ...; ``method_<name>`` for one key per
    explanation method.
    """
    out = {}
    for key in _ROW.findall(text):
        pattern = re.escape(key).replace("NNN", r"\d{3}").replace("<name>", "[a-z_]+")
        out[key] = re.compile(pattern + r"\Z")
    return out


def test_the_page_parser_reads_key_rows():
    page = "| key | shape |\n|---|---|\n| `rollout` | (gh, gw) |\n| `query_map_NNN` | x |\n| `method_<name>` | y |\n"
    keys = documented(page)
    assert set(keys) == {"rollout", "query_map_NNN", "method_<name>"}
    assert keys["query_map_NNN"].match("query_map_012") and not keys["query_map_NNN"].match("query_map_12")
    assert keys["method_<name>"].match("method_attnlrp")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, set[str]]:
    root = tmp_path_factory.mktemp("export-keys")
    star, square = root / "star.png", root / "square.png"
    make_sample(2).image.save(star)
    make_sample(5, label=1).image.save(square)
    methods = ",".join(METHODS)
    runs = {
        "demo": [
            "--model", "demo", "--causal", "--class", "4", "--class-minus", "1", "--patch-from", str(square),
            "--methods", methods, "--gif", "rollout", "--query-xy", "40,40", "--sae", str(DEMO_SAE_DIR),
        ],
        "demo-clip": [
            "--model", "demo-clip", "--labels", "circle,square,star", "--causal", "--label", "star",
            "--label-minus", "circle", "--patch-from", str(square), "--relevance-from-block", "0",
        ],
        "mobilevit": ["--model", str(save_tiny("mobilevit", root / "tiny-mobilevit")), "--gif", "mean"],
    }  # fmt: skip
    keys = {}
    for name, options in runs.items():
        out = root / name
        assert main(["export", *options, "--device", "cpu", "--out", str(out), str(star)]) == 0, name
        with np.load(out / "star.npz", allow_pickle=False) as z:
            keys[name] = set(z.files)
    assert (root / "demo" / "star_rollout.gif").is_file()
    assert (root / "mobilevit" / "star_attention.png").is_file()  # no rollout: the last block's map instead
    return keys


def test_every_exported_key_is_documented(exported):
    patterns = documented(PAGE.read_text(encoding="utf-8"))
    for name, keys in exported.items():
        missing = sorted(k for k in keys if not any(p.match(k) for p in patterns.values()))
        assert not missing, f"{name} export writes keys docs/export.md does not name: {missing}"


def test_every_documented_key_is_exported(exported):
    patterns = documented(PAGE.read_text(encoding="utf-8"))
    written = set().union(*exported.values())
    never = sorted(doc for doc, p in patterns.items() if not any(p.match(k) for k in written))
    assert not never, f"docs/export.md names keys no export wrote: {never}"
    assert {f"method_{m}" for m in METHODS} <= exported["demo"]  # one key per method asked for
    assert "rollout_note" in exported["mobilevit"] and "rollout" not in exported["mobilevit"]
