"""Named hook points (vitviz.models.points, vitviz.models.hooks): records equal test-local hooks; edits change exactly their slice."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from conftest import random_image

from vitviz.capture.forward import capture, input_size_for, preprocess
from vitviz.models import hooks as H
from vitviz.models import points as P

pytestmark = pytest.mark.usefixtures("one_thread")


def _pixels(loaded, img):
    hw = input_size_for(loaded, None, img.size)
    return preprocess(loaded, [img], hw)[0], hw


def _forward(loaded, pixels, hw):
    fam = loaded.family
    with torch.no_grad(), fam.running(loaded.model):
        return fam.forward(loaded.model, fam.model_inputs(loaded, pixels, hw))


def _run(loaded, img, **kw):
    """Logits (B, C) and the recorded values of one forward inside ``points.active``."""
    pixels, hw = _pixels(loaded, img)
    batch = kw.get("batch", 1)
    if batch > 1:
        pixels = pixels.expand(batch, *pixels.shape[1:]).contiguous()
    with H.active(loaded, **kw) as state:
        out = _forward(loaded, pixels, hw)
    return out.logits, state.values


def _hook_count(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_names_are_the_same_in_every_plain_family(tiny_models):
    for key in ("vit", "deit", "dinov2", "beit"):
        names = set(H.installed_points(tiny_models[key].model).names())
        for i in range(2):
            assert {f"blocks.{i}.{p}" for p in ("in", "attn.pattern", "attn.z", "mlp.out", "out")} <= names
        assert "embed.out" in names


def test_hierarchical_names_carry_the_stage(hier_dirs):
    from vitviz.models.load import load_model

    swin = load_model(str(hier_dirs["swin"]), device="cpu")
    pts = H.installed_points(swin.model)
    assert pts.prefixes == ("stages.0.blocks.0", "stages.0.blocks.1", "stages.1.blocks.0", "stages.1.blocks.1")
    assert "stages.1.blocks.1.attn.z" in pts and "stages.0.blocks.0.out" in pts
    assert P.block_name(pts, 2, "attn.z") == "stages.1.blocks.0.attn.z"


def test_record_equals_manual_forward_hooks(tiny_models):
    loaded = tiny_models["vit"]
    model = loaded.model
    img = random_image(1)
    pixels, hw = _pixels(loaded, img)
    got: dict[str, torch.Tensor] = {}
    handles = [model.vit.embeddings.register_forward_hook(lambda m, a, o: got.__setitem__("embed.out", o.clone()))]
    for i, layer in enumerate(model.vit.layers):
        handles += [
            layer.register_forward_pre_hook(lambda m, a, i=i: got.__setitem__(f"blocks.{i}.in", a[0].clone())),
            layer.attention.o_proj.register_forward_pre_hook(
                lambda m, a, i=i: got.__setitem__(f"blocks.{i}.attn.z", a[0].clone())
            ),
            layer.mlp.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(f"blocks.{i}.mlp.out", o.clone())),
            layer.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(f"blocks.{i}.out", o.clone())),
        ]
    try:
        ref_logits = _forward(loaded, pixels, hw).logits
    finally:
        for h in handles:
            h.remove()
    from vitviz.models.families.base import Call

    with H.active(loaded, record=None, call=Call(loaded.config, hw, 1)) as state:
        logits = _forward(loaded, pixels, hw).logits
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=0)
    for name, ref in got.items():
        torch.testing.assert_close(state.values[name], ref, rtol=0, atol=0, msg=name)
    cap = capture(loaded, img, attention_dtype="float32")
    for i in range(2):
        np.testing.assert_allclose(state.values[f"blocks.{i}.attn.pattern"][0].numpy(), cap.blocks[i].attention)
    assert state.values["embed.out"] is state.values["blocks.0.in"]
    with H.active(loaded, record=["blocks.1.out"]) as only:
        _forward(loaded, pixels, hw)
    assert set(only.values) == {"blocks.1.out"}


def test_zero_one_head_changes_exactly_its_columns(tiny_models):
    """Hand check: zeroing z_h of block 1 lowers the attention update by W_O[:, h] z_h, nothing before block 1."""
    loaded = tiny_models["vit"]
    img = random_image(2)
    clean_logits, clean = _run(loaded, img, record=None)
    edit = P.Edit("blocks.1.attn.z", "zero", heads=(2,))
    logits, got = _run(loaded, img, record=None, edits=[edit], num_heads={"blocks.1.attn.z": 4})
    d = 8
    z0, z1 = clean["blocks.1.attn.z"], got["blocks.1.attn.z"]
    assert torch.all(z1[..., 2 * d : 3 * d] == 0)
    torch.testing.assert_close(z1[..., : 2 * d], z0[..., : 2 * d], rtol=0, atol=0)
    torch.testing.assert_close(z1[..., 3 * d :], z0[..., 3 * d :], rtol=0, atol=0)
    for name in ("embed.out", "blocks.0.out", "blocks.1.in"):
        torch.testing.assert_close(got[name], clean[name], rtol=0, atol=0)
    w = loaded.model.vit.layers[1].attention.o_proj.weight[:, 2 * d : 3 * d]  # (D, d)
    attn_clean = clean["blocks.1.out"] - clean["blocks.1.mlp.out"]  # ViT: out = in + attention + MLP
    attn_edit = got["blocks.1.out"] - got["blocks.1.mlp.out"]
    torch.testing.assert_close(attn_edit - attn_clean, -(z0[..., 2 * d : 3 * d] @ w.T), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits, clean_logits)


def test_replace_mean_and_patch_by_hand(tiny_models):
    loaded = tiny_models["vit"]
    img, src = random_image(3), random_image(4)
    _, clean = _run(loaded, img, record=None)
    src_logits, source = _run(loaded, src, record=None)
    v = torch.arange(32, dtype=torch.float32)
    _, got = _run(loaded, img, record=None, edits=[P.Edit("blocks.0.out", "replace", v, tokens=(3,))])
    x0, x1 = clean["blocks.0.out"], got["blocks.0.out"]
    torch.testing.assert_close(x1[0, 3], v)
    keep = [t for t in range(x0.shape[1]) if t != 3]
    torch.testing.assert_close(x1[0, keep], x0[0, keep], rtol=0, atol=0)
    torch.testing.assert_close(got["blocks.1.in"], x1, rtol=0, atol=0)

    _, got = _run(loaded, img, record=None, edits=[P.Edit("blocks.0.out", "mean")])
    torch.testing.assert_close(got["blocks.0.out"][0], x0[0].mean(0, keepdim=True).expand_as(x0[0]))

    class Source:  # a patch reads the other run's value at the same point
        def activation(self, name):
            return source[name]

    _, got = _run(loaded, img, record=None, edits=[P.Edit("blocks.0.out", "patch", Source(), tokens=(0, 5))])
    torch.testing.assert_close(got["blocks.0.out"][0, [0, 5]], source["blocks.0.out"][0, [0, 5]])
    torch.testing.assert_close(got["blocks.0.out"][0, 1:5], x0[0, 1:5], rtol=0, atol=0)
    logits, _ = _run(loaded, img, edits=[P.Edit("blocks.1.out", "patch", source["blocks.1.out"])])
    torch.testing.assert_close(logits, src_logits, rtol=1e-6, atol=1e-6)  # the readout sees only the last residual


def test_rows_pick_copies_of_a_batched_call(tiny_models):
    loaded = tiny_models["vit"]
    img = random_image(5)
    clean, _ = _run(loaded, img)
    one, _ = _run(loaded, img, edits=[P.Edit("blocks.0.attn.z", "zero", heads=(1,))], num_heads={"blocks.0.attn.z": 4})
    both, _ = _run(
        loaded,
        img,
        batch=3,
        edits=[P.Edit("blocks.0.attn.z", "zero", heads=(1,), rows=(1,))],
        num_heads={"blocks.0.attn.z": 4},
    )
    torch.testing.assert_close(both[0], clean[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(both[1], one[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(both[2], clean[0], rtol=1e-5, atol=1e-6)


def test_bad_edits_are_refused(tiny_models):
    loaded = tiny_models["vit"]
    img = random_image(6)
    with pytest.raises(ValueError, match=r"no hook point 'blocks\.7\.out'"):
        _run(loaded, img, edits=[P.Edit("blocks.7.out", "zero")])
    with pytest.raises(ValueError, match="number of heads"):
        _run(loaded, img, edits=[P.Edit("blocks.0.attn.z", "zero", heads=(0,))])
    with pytest.raises(ValueError, match=r"heads can be selected at .*attn\.z.*not at blocks\.0\.out"):
        _run(loaded, img, edits=[P.Edit("blocks.0.out", "zero", heads=(0,))])
    with pytest.raises(ValueError, match="needs a value"):
        P.Edit("blocks.0.out", "replace")
    with pytest.raises(ValueError, match="op is one of"):
        P.Edit("blocks.0.out", "half")
    with pytest.raises(ValueError, match=r"tokens \[99\] outside"):
        _run(loaded, img, edits=[P.Edit("blocks.0.out", "zero", tokens=(99,))])
    with pytest.raises(Exception, match="cannot patch"):
        _run(loaded, img, edits=[P.Edit("blocks.0.out", "patch", torch.zeros(1, 5, 32))])
    assert H.current() is None


def test_threads_with_different_edits_do_not_see_each_other(tiny_models):
    loaded = tiny_models["vit"]
    img = random_image(7)
    heads = {"blocks.0.attn.z": 4, "blocks.1.attn.z": 4}
    plans = {
        "zero": [P.Edit("blocks.0.attn.z", "zero", heads=(0, 1))],
        "mean": [P.Edit("blocks.1.attn.z", "mean", heads=(3,))],
        "none": [],
    }
    expected = {k: _run(loaded, img, edits=e, num_heads=heads)[0] for k, e in plans.items()}
    assert not torch.allclose(expected["zero"], expected["none"])
    errors: list[BaseException] = []

    def worker(key):
        try:
            for _ in range(15):
                got, _ = _run(loaded, img, edits=plans[key], num_heads=heads)
                torch.testing.assert_close(got, expected[key], rtol=0, atol=0)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in plans for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_nothing_left_behind_after_a_failing_forward(tiny_models):
    loaded = tiny_models["beit"]
    img = random_image(8)
    clean, _ = _run(loaded, img)
    count = _hook_count(loaded.model)

    def boom(module, args):
        if H.current() is not None:
            raise RuntimeError("failure inside an edited forward")

    handle = loaded.model.beit.layers[1].register_forward_pre_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="inside an edited forward"):
            _run(loaded, img, edits=[P.Edit("blocks.0.out", "zero")], record=None)
    finally:
        handle.remove()
    assert H.current() is None
    assert _hook_count(loaded.model) == count
    again, _ = _run(loaded, img)
    torch.testing.assert_close(again, clean, rtol=0, atol=0)
    assert H.install(loaded.model, loaded.family).points is H.installed_points(loaded.model)  # installed once
    assert _hook_count(loaded.model) == count
