"""Where Ray is not installed (an optional dependency), ``--engine ray`` is a message naming what to install, for
``evaluate`` and ``sae index`` (``sae train``: tests/sae/test_sae_train_ray.py), not an ImportError traceback."""

from __future__ import annotations

import sys

import pytest

from vitviz.__main__ import main
from vitviz.data.shapes import write_dataset
from vitviz.sae.demo import DEMO_SAE_DIR

MESSAGE = "needs Ray Data: pip install 'vitviz[ray]'"


@pytest.fixture()
def no_ray(monkeypatch):
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is not installed


def test_evaluate_on_ray_without_ray_is_a_message(tmp_path, no_ray, capsys):
    data = write_dataset(tmp_path / "data", n=3, seed=1)
    out = tmp_path / "r.parquet"
    rc = main(["evaluate", "--data", str(data), "--out", str(out), "--methods", "random", "--engine", "ray"])
    err = capsys.readouterr().err
    assert rc != 0 and MESSAGE in err and "Traceback" not in err, err


def test_sae_index_on_ray_without_ray_is_a_message(tmp_path, no_ray, capsys):
    data = write_dataset(tmp_path / "data", n=3, seed=1)
    out = tmp_path / "i.parquet"
    rc = main(["sae", "index", "--sae", str(DEMO_SAE_DIR), "--data", str(data), "--out", str(out), "--engine", "ray"])
    err = capsys.readouterr().err
    assert rc != 0 and MESSAGE in err and "Traceback" not in err, err
