"""``metrics.json`` beside an SAE is read only when it is one: the page formats its numbers, so a file that is not
(another tool's, a damaged one) gives None, never an error while drawing."""

from __future__ import annotations

import json
import shutil

import pytest

from vitviz.sae.demo import DEMO_SAE_DIR
from vitviz.sae.measure import METRICS_FILE, read_metrics


def test_the_bundled_metrics_are_read():
    m = read_metrics(DEMO_SAE_DIR)
    assert m is not None and m["images"] == 100 and m["tokens"] == 14400 and m["scope"] == "patches"


@pytest.mark.parametrize(
    "change",
    [
        {"images": "100"},
        {"tokens": 14400.5},
        {"explained_variance": None},
        {"l0": True},
        {"scope": 3},
        {"splice_mean_kl": "small"},
    ],
)
def test_a_file_that_is_not_one_is_none(tmp_path, change):
    good = json.loads((DEMO_SAE_DIR / METRICS_FILE).read_text())
    (tmp_path / METRICS_FILE).write_text(json.dumps({**good, **change}))
    assert read_metrics(tmp_path) is None


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"images": 1}', "\udcff"])
def test_unreadable_or_partial_files_are_none(tmp_path, text):
    (tmp_path / METRICS_FILE).write_bytes(text.encode("utf-8", "surrogateescape"))
    assert read_metrics(tmp_path) is None


def test_missing_splice_measures_are_allowed(tmp_path):
    shutil.copy(DEMO_SAE_DIR / METRICS_FILE, tmp_path / METRICS_FILE)
    m = json.loads((tmp_path / METRICS_FILE).read_text())
    m.pop("splice_top1_agreement", None), m.pop("splice_mean_kl", None)
    (tmp_path / METRICS_FILE).write_text(json.dumps(m))
    assert read_metrics(tmp_path)["l0"] == 16.0
