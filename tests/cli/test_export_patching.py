"""``export --causal`` with targets (--class-minus, --label) and --patch-from; usage messages for bad combinations."""

from __future__ import annotations

import numpy as np
import pytest

from vitviz.__main__ import main
from vitviz.capture.targets import Target
from vitviz.causal import activation_patching, causal_arrays, logit_lens, patch_lens
from vitviz.data.images import load_image
from vitviz.data.shapes import make_sample

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    paths = []
    for i in (220, 221):
        p = root / f"s{i}.png"
        make_sample(i).image.save(p)
        paths.append(p)
    return paths


def test_patch_from_writes_the_patching_arrays(shapes, demo_model, tmp_path, capsys):
    target, source = shapes
    rc = main(
        ["export", "--model", "demo", "--out", str(tmp_path), "--causal", "--patch-from", str(source), str(target)]
    )
    assert rc == 0, capsys.readouterr().err
    img, src = load_image(target), load_image(source)
    ref = activation_patching(demo_model, img, src)
    with np.load(tmp_path / f"{target.stem}.npz", allow_pickle=False) as z:
        c = int(z["explained_class"])
        assert int(z["patching_class"]) == c == ref.target.index
        assert z["patching_residual"].shape == (4, len(z["token_kinds"])) and z["patching_heads"].shape == (4, 4)
        np.testing.assert_allclose(z["patching_residual"], ref.residual, rtol=1e-5)
        np.testing.assert_allclose(z["patching_heads"], ref.heads, rtol=1e-5)
        np.testing.assert_allclose(z["patching_heads_estimate"], ref.heads_estimate, rtol=1e-5)
        assert z["patching_residual_estimate"].shape == z["patching_residual"].shape
        assert float(z["patching_clean_logit"]) == pytest.approx(float(z["logits"][c]), rel=1e-5)
        assert float(z["patching_clean_logit"]) == pytest.approx(float(z["logit_lens"][-1, c]), rel=1e-5)
        lens = z["logit_lens_patches"]
        gh, gw = (int(v) for v in z["grid"])
        assert lens.shape == (5, gh, gw) and lens.dtype == np.float32
        np.testing.assert_allclose(lens, patch_lens(demo_model, img), rtol=1e-5)
        assert str(z["target_kind"]) == "class" and int(z["target_minus"]) == -1


def test_class_minus_explains_the_difference(shapes, demo_model, tmp_path, capsys):
    target, _ = shapes
    rc = main(
        [
            "export",
            "--model",
            "demo",
            "--out",
            str(tmp_path),
            "--causal",
            "--class",
            "3",
            "--class-minus",
            "1",
            str(target),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    img = load_image(target)
    a, _ = causal_arrays(demo_model, img, target=3)
    b, _ = causal_arrays(demo_model, img, target=1)
    with np.load(tmp_path / f"{target.stem}.npz", allow_pickle=False) as z:
        assert (int(z["target_index"]), int(z["target_minus"])) == (3, 1)
        assert "minus" in str(z["target_name"])
        np.testing.assert_allclose(z["head_ablation"], a["head_ablation"] - b["head_ablation"], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(z["head_attribution"], a["head_attribution"] - b["head_attribution"], rtol=1e-6)
        total = z["head_attribution"].sum() + z["mlp_attribution"].sum() + float(z["attribution_rest"])
        lens = logit_lens(demo_model, img).logits
        assert total == pytest.approx(float(lens[-1, 3] - lens[-1, 1]), rel=1e-4)
        by_class = patch_lens(demo_model, img, target=3) - patch_lens(demo_model, img, target=1)
        np.testing.assert_allclose(z["logit_lens_patches"], by_class, rtol=1e-4, atol=1e-5)
        assert np.array_equal(patch_lens(demo_model, img, target=Target.of_class(3, 1)), z["logit_lens_patches"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--patch-from", "SRC"], "--patch-from needs --causal"),
        (["--causal", "--patch-from", "SRC", "TWO"], "one source into one target image; 2 images"),
        (["--class-minus", "1"], "--class-minus needs --causal"),
        (["--causal", "--class-minus", "1"], "--class-minus needs --class"),
        (["--causal", "--label", "cat"], "--label needs --labels"),
        (["--causal", "--labels", "cat,dog", "--label", "bird"], "'bird' is not one of --labels"),
        (["--causal", "--class", "1", "--class-minus", "1"], "must differ"),
    ],
)
def test_bad_combinations_are_usage_errors(extra, message, shapes, tmp_path, capsys):
    target, source = shapes
    argv = ["export", "--model", "demo", "--out", str(tmp_path)]
    args = [str(source) if a == "SRC" else str(target) if a == "TWO" else a for a in extra]
    rc = main([*argv, *args, str(target)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err
    assert not list(tmp_path.glob("*.npz"))


def test_a_missing_source_is_a_message(shapes, tmp_path, capsys):
    rc = main(
        [
            "export",
            "--model",
            "demo",
            "--out",
            str(tmp_path),
            "--causal",
            "--patch-from",
            str(tmp_path / "no.png"),
            str(shapes[0]),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1 and "no.png" in err and "Traceback" not in err


def test_a_zero_shot_label_minus_another_label(shapes, tmp_path, capsys):
    from vitviz.capture.targets import Target
    from vitviz.causal import knock_out
    from vitviz.models.load import load_model
    from vitviz.models.zeroshot import parse_labels

    target, source = shapes
    argv = ["export", "--model", "demo-clip", "--out", str(tmp_path), "--causal", "--labels", "circle,square,star"]
    rc = main([*argv, "--label", "square", "--label-minus", "circle", "--patch-from", str(source), str(target)])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "logit_lens_patches left out" in err
    clip = load_model("demo-clip")
    labels = parse_labels("circle,square,star", clip.text.template)
    img = load_image(target)
    ko = knock_out(clip, img, [(0, 1)], mode="zero", target=Target.of_label(labels, "square"))
    with np.load(tmp_path / f"{target.stem}.npz", allow_pickle=False) as z:
        assert str(z["target_kind"]) == "label" and str(z["target_label"]) == "square"
        assert str(z["target_minus_label"]) == "circle" and int(z["explained_class"]) == 1
        assert z["head_ablation"][0, 1] == pytest.approx(ko.effect[1] - ko.effect[0], rel=1e-3, abs=1e-4)
        clean = float(z["logits"][1] - z["logits"][0])
        assert float(z["patching_clean_logit"]) == pytest.approx(clean, rel=1e-4, abs=1e-4)
        assert "patching_heads" in z.files and z["patching_residual"].shape[0] == z["patching_heads"].shape[0]
        last = z["patching_residual"][-1]  # the last block's output: only what the pooled read-out reads matters
        assert last[0] != pytest.approx(float(z["patching_clean_logit"]), abs=1e-4)


class _Counter:
    """Counts calls through the model's own top-level forward."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.n += 1


@pytest.mark.parametrize("patch", [False, True])
def test_causal_export_runs_one_clean_forward_per_image(patch, shapes, demo_model, tmp_path, capsys, monkeypatch):
    """The attention arrays, the causal arrays, the per-patch lens and patching read one Run per image; the
    source of a patch adds one light forward (shared by every target)."""
    import vitviz.models.load as load
    from vitviz.capture.forward import capture
    from vitviz.capture.run import clear_runs

    target, source = shapes
    clear_runs()
    monkeypatch.setattr(load, "load_model", lambda *a, **k: demo_model)
    count = _Counter(demo_model.model)
    try:
        args = ["export", "--model", "demo", "--out", str(tmp_path), "--causal", "--class", "2", str(target)]
        rc = main(args + (["--patch-from", str(source)] if patch else []))
    finally:
        count.handle.remove()
        clear_runs()
    assert rc == 0, capsys.readouterr().err
    assert count.n == (2 if patch else 1)
    ref = capture(demo_model, load_image(target))  # the attention written equals a plain capture's
    with np.load(tmp_path / f"{target.stem}.npz", allow_pickle=False) as z:
        assert ("patching_heads" in z) == patch and "head_ablation" in z
        np.testing.assert_allclose(z["logits"], ref.logits, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(z["attentions"], ref.attention_stack.astype(np.float32))
