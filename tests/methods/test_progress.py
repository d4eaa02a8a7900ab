"""explain_many reports each method as it starts and once at the end (the Compare page's per-method progress)."""

from pathlib import Path

from vitviz.data.images import load_image
from vitviz.methods import explain_many

IMAGE = Path(__file__).resolve().parents[2] / "assets" / "examples" / "demo-star.png"


def test_progress_names_each_method_before_it_runs_and_ends_at_total(demo_model):
    calls = []
    maps = explain_many(
        demo_model,
        load_image(IMAGE),
        ["attention", "rollout", "random"],
        progress=lambda done, total, name: calls.append((done, total, name, len(calls))),
    )
    assert [(d, t, n) for d, t, n, _ in calls] == [
        (0, 3, "attention"),
        (1, 3, "rollout"),
        (2, 3, "random"),
        (3, 3, ""),
    ]
    assert list(maps) == ["attention", "rollout", "random"]
