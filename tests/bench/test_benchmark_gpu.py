"""``benchmarks.gpu``, the prepared check of vitviz's CUDA path, runs end to end on the CPU (``--device cpu
--quick``: tiny stand-ins of the random ViT-B/16 and DINOv2-base, the bundled demo) and reports every step;
its helpers flag what would hide a device bug (a NaN, a shape change) and its summary names every failure.

The end-to-end run is a fresh interpreter, as the device machine runs it, so that its check that no plotly or
streamlit module is imported is not spoilt by other tests. Timings are written by the script, never asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.gpu import STEPS, attempt, diff, summary_lines  # noqa: E402


def test_diff_flags_a_nan_or_a_shape_change_instead_of_skipping_it():
    a = np.array([[0.25, 0.75], [0.5, 0.5]])
    assert diff(a, a + np.array([[0.0, 1e-3], [0.0, 0.0]]))["max_abs"] == pytest.approx(1e-3)
    with_nan = a.copy()
    with_nan[1, 0] = np.nan
    assert diff(a, with_nan)["max_abs"] == float("inf")
    assert diff(a, a[:1])["max_abs"] == float("inf")
    assert diff(with_nan, with_nan)["max_abs"] == 0.0  # NaN where both leave a value undefined is no difference


def test_attempt_keeps_the_error_and_its_traceback():
    def broken():
        raise RuntimeError("Expected all tensors to be on the same device")

    got = attempt(broken)
    assert got["ok"] is False
    assert got["error"] == "RuntimeError: Expected all tensors to be on the same device"
    assert "in broken" in got["traceback"]
    assert attempt(lambda: {"x": 1})["x"] == 1


def test_summary_names_a_failed_step_and_a_failed_part():
    results = {
        "env": {"ok": True, "device": "cuda", "gpu_name": "H100"},
        "parity": {"ok": False, "error": "RuntimeError: boom"},
        "methods": {
            "ok": True,
            "seconds": 1.0,
            "gradcam": {"ok": False, "error": "RuntimeError: Expected all tensors to be on the same device"},
            "failed": ["gradcam"],
        },
        "seconds": 2.0,
    }
    text = "\n".join(summary_lines(results))
    assert "[parity] FAILED: RuntimeError: boom" in text
    assert "gradcam: ERROR RuntimeError: Expected all tensors to be on the same device" in text
    assert "failed: ['gradcam']" in text


def _failed_parts(node, path: str = "") -> list[str]:
    """Paths of every part (a dict with ``ok``) that failed, anywhere in the results."""
    found = []
    if isinstance(node, dict):
        if node.get("ok") is False:
            found.append(path)
        for k, v in node.items():
            found += _failed_parts(v, f"{path}.{k}" if path else k)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _failed_parts(v, f"{path}[{i}]")
    return found


@pytest.mark.slow
def test_the_quick_run_on_the_cpu_reports_every_step(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}  # one thread: a busy 2-core machine
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--device", "cpu", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    r = json.loads((tmp_path / "gpu.json").read_text())
    text = (tmp_path / "gpu.txt").read_text()

    assert all(r[step]["ok"] for step in STEPS), {s: r[s].get("error") for s in STEPS}
    # Every part ran, but float16, which the loader refuses on the CPU (and the script records, not raises).
    assert sorted(_failed_parts(r)) == ["precision.demo_float16", "precision.vit_float16"]
    assert "float16 needs a GPU" in r["precision"]["demo_float16"]["error"]
    assert all(f"[{step}]" in text for step in STEPS) and "FAILED" not in text

    assert r["env"]["forbidden_loaded"] == [] and r["imports_at_end"]["forbidden_loaded"] == []
    for key in ("demo", "vit"):
        p = r["placement"][key]
        assert p["capture_clean"] and p["capture_record"]["numpy_arrays"] > 0
        assert p["run_record"]["not_numpy"] == []
        assert p["run_record"]["lazy_summary_tensors"] > 0  # a Run's capture computes its summaries when read
        assert r["parity"][key]["tf32_off_within_tol"]
        assert set(r["parity"][key]["tf32_off"]) >= {"attention", "rollout", "relevance", "entropy", "distance"}
        bf16 = r["precision"][f"{key}_bfloat16"]
        assert bf16["record_dtypes"]["fused"] == "float32" and bf16["run_and_relevance"]["ok"]
    speed = r["speed"]
    for key in ("overhead_vit", "overhead_dino"):
        assert speed[key]["run_s"] > 0 and speed[key]["plain_sdpa_s"] > 0
    for key in ("export_vit", "export_demo"):
        assert speed[key]["batch_8_over_one_at_a_time"] > 0 and speed[key]["batch_32_over_one_at_a_time"] > 0
    assert speed["evaluate"]["images"] == 3 and speed["evaluate"]["skipped"] == []
    memory = r["memory"]
    assert [row["side"] for row in memory["vit"]] == [64, 96, 128] and len(memory["dino"]) == 1
    for case in ("capture", "run", "relevance", "batch_32"):
        assert memory["refusals"][case]["refused"], case
    assert r["causal"]["errors"] == [] and r["methods"]["failed"] == []
    assert set(r["methods"]) >= {"attention", "rollout", "relevance", "gradcam", "integrated_gradients", "random"}
