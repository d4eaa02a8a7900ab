"""Activation patching, attribution patching and the per-patch lens against naive references (plain hooks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import random_image

from vitviz.analysis.first_order import head_estimate, rank_correlation, residual_estimate
from vitviz.capture.forward import preprocess
from vitviz.capture.targets import Target
from vitviz.causal import NotDefined, PatchingCancelled, activation_patching, logit_lens, patch_lens, patching_arrays

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hier_models(hier_dirs):
    from vitviz.models.load import load_model

    return {k: load_model(str(hier_dirs[k]), device="cpu") for k in ("swin", "mobilevitv2")}


def _out(o):
    return o[0] if isinstance(o, (tuple, list)) else o


def _swap(o, new):
    return (new, *o[1:]) if isinstance(o, (tuple, list)) else new


def naive(model, layers, pixels_t, pixels_s, c):
    """Full forward per position with plain forward hooks: residual (L, T), heads (L, H), clean, source."""
    outs, zs = {}, {}
    hooks = []
    for i, layer in enumerate(layers):
        hooks.append(layer.register_forward_hook(lambda m, a, o, i=i: outs.__setitem__(i, _out(o).detach().clone())))
        hooks.append(
            layer.attention.o_proj.register_forward_pre_hook(lambda m, a, i=i: zs.__setitem__(i, a[0].detach().clone()))
        )
    with torch.no_grad():
        source = float(model(pixel_values=pixels_s).logits[0, c])
    src_out, src_z = dict(outs), dict(zs)
    for h in hooks:
        h.remove()
    with torch.no_grad():
        clean = float(model(pixel_values=pixels_t).logits[0, c])
    n_layers, tokens = len(layers), src_out[0].shape[1]
    n_heads = model.config.num_attention_heads
    d = src_z[0].shape[-1] // n_heads
    res = np.zeros((n_layers, tokens))
    heads = np.zeros((n_layers, n_heads))
    for layer_i, layer in enumerate(layers):
        for t in range(tokens):

            def hook(m, a, o, t=t, li=layer_i):
                x = _out(o).clone()
                x[:, t] = src_out[li][:, t]
                return _swap(o, x)

            h = layer.register_forward_hook(hook)
            with torch.no_grad():
                res[layer_i, t] = float(model(pixel_values=pixels_t).logits[0, c])
            h.remove()
        for hh in range(n_heads):

            def pre(m, a, hh=hh, li=layer_i):
                z = a[0].clone()
                z[..., hh * d : (hh + 1) * d] = src_z[li][..., hh * d : (hh + 1) * d]
                return (z, *a[1:])

            h = layer.attention.o_proj.register_forward_pre_hook(pre)
            with torch.no_grad():
                heads[layer_i, hh] = float(model(pixel_values=pixels_t).logits[0, c])
            h.remove()
    return res, heads, clean, source


def test_exact_patching_equals_a_full_forward_per_position(tiny_models):
    loaded = tiny_models["vit"]
    img_t, img_s = random_image(1, (32, 32)), random_image(2, (40, 30))
    pt, _ = preprocess(loaded, [img_t], (32, 32))
    ps, _ = preprocess(loaded, [img_s], (32, 32))
    res, heads, clean, source = naive(loaded.model, loaded.model.vit.layers, pt, ps, 2)
    p = activation_patching(loaded, img_t, img_s, target=2, chunk=5)
    assert p.residual.shape == (2, 17) and p.heads.shape == (2, 4)
    np.testing.assert_allclose(p.residual, res, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(p.heads, heads, rtol=1e-4, atol=1e-5)
    assert p.clean == pytest.approx(clean, rel=1e-5) and p.source == pytest.approx(source, rel=1e-5)
    assert np.abs(res - clean).max() > 1e-3  # the patches do change the logit
    assert p.token_kinds[0] == "CLS" and p.grid == (4, 4) and p.num_prefix == 1
    np.testing.assert_allclose(p.residual[-1, 1:], clean, rtol=1e-5)  # only CLS is read at the last block
    assert p.residual[-1, 0] == pytest.approx(source, rel=1e-4)  # ... so patching it gives the source logit
    # a difference target is the difference of the two classes' grids (patched logits are linear in the target)
    q0 = activation_patching(loaded, img_t, img_s, target=0, estimate=False)
    d = activation_patching(loaded, img_t, img_s, target=Target.of_class(2, minus=0), estimate=False)
    np.testing.assert_allclose(d.residual, p.residual - q0.residual, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(d.heads, p.heads - q0.heads, rtol=1e-4, atol=1e-5)
    arrays = patching_arrays(p)
    assert int(arrays["patching_class"]) == 2 and arrays["patching_residual"].dtype == np.float32


@pytest.mark.parametrize("key", ["vit", "deit", "beit"])
def test_patching_an_image_with_itself_gives_the_clean_logit_everywhere(key, tiny_models):
    loaded, img = tiny_models[key], random_image(3, (32, 32))
    p = activation_patching(loaded, img, img, target=1)
    for grid in (p.residual, p.heads, p.residual_estimate, p.heads_estimate):
        np.testing.assert_allclose(grid, p.clean, rtol=1e-5, atol=1e-5)
    assert p.source == pytest.approx(p.clean)


def test_full_forward_edits_give_the_replayed_residual_grid(tiny_models):
    """Where a run cannot be replayed (zero-shot label scores) the residual patch is an edit of blocks.{l}.out
    in a full forward: the same numbers as the replay from block l + 1."""
    from vitviz.causal.patching import _runs
    from vitviz.models.points import Edit

    loaded = tiny_models["vit"]
    img_t, img_s = random_image(17, (32, 32)), random_image(18, (32, 32))
    p = activation_patching(loaded, img_t, img_s, target=0, estimate=False, heads=False)
    clean, source = _runs(loaded, img_t, img_s, None, 2**30, None, False)
    edits = [Edit("blocks.0.out", "patch", source, tokens=(t,), rows=(t,)) for t in range(17)]
    got = clean.edited(edits, batch=17, reuse_prefix=False)
    np.testing.assert_allclose(p.residual[0], got.scores[:, 0].numpy(), rtol=1e-5, atol=1e-5)


def test_patching_every_token_of_the_last_block_gives_the_source_logit(demo_model):
    from vitviz.causal.patching import _runs

    img_t, img_s = random_image(4, (64, 64)), random_image(5, (48, 70))
    clean, source = _runs(demo_model, img_t, img_s, None, 2**30, None, False)
    last = clean.sites[-1].index
    with torch.inference_mode():
        got = clean._replay(clean.num_blocks, source.block_tokens(last)[1])[0]
    torch.testing.assert_close(got, source.scores, rtol=1e-5, atol=1e-5)
    p = activation_patching(demo_model, img_t, img_s, estimate=False)
    c = p.target.index
    assert c == int(torch.argmax(clean.scores)) and p.source == pytest.approx(float(source.scores[c]), rel=1e-5)


def test_estimates_by_hand_and_forward_equivalents(tiny_models):
    """The estimate is clean + grad . (source - target), with the gradient taken by a plain backward here."""
    loaded = tiny_models["vit"]
    img_t, img_s = random_image(6, (32, 32)), random_image(7, (32, 32))
    model, layers = loaded.model, loaded.model.vit.layers
    pt, _ = preprocess(loaded, [img_t], (32, 32))
    ps, _ = preprocess(loaded, [img_s], (32, 32))
    rec: dict = {}

    def grab(tag):
        hooks = []
        for i, layer in enumerate(layers):
            hooks.append(layer.register_forward_hook(lambda m, a, o, i=i: rec.__setitem__((tag, "out", i), _out(o))))
            hooks.append(
                layer.attention.o_proj.register_forward_pre_hook(lambda m, a, i=i: rec.__setitem__((tag, "z", i), a[0]))
            )
        return hooks

    hooks = grab("s")
    with torch.no_grad():
        model(pixel_values=ps)
    for h in hooks:
        h.remove()
    hooks = grab("t")
    with torch.enable_grad():
        x = pt.clone().requires_grad_(True)
        y = model(pixel_values=x).logits[0, 1]
        wrt = [rec[("t", k, i)] for k in ("out", "z") for i in range(2)]
        grads = torch.autograd.grad(y, wrt)
    for h in hooks:
        h.remove()
    y0 = float(y.detach())
    p = activation_patching(loaded, img_t, img_s, target=1, exact=False)
    assert p.residual is None and p.heads is None
    for i in range(2):
        g, a, s = (v[0].detach().double().numpy() for v in (grads[i], rec[("t", "out", i)], rec[("s", "out", i)]))
        np.testing.assert_allclose(p.residual_estimate[i], y0 + (g * (s - a)).sum(-1), rtol=1e-4, atol=1e-5)
        gz, z, sz = (v[0].detach().double().numpy() for v in (grads[2 + i], rec[("t", "z", i)], rec[("s", "z", i)]))
        by_head = (gz * (sz - z)).sum(0).reshape(4, -1).sum(1)
        np.testing.assert_allclose(p.heads_estimate[i], y0 + by_head, rtol=1e-4, atol=1e-5)
    assert p.forward_equivalents == pytest.approx(3.0)  # two clean forwards + one backward


def test_cost_with_prefix_reuse(tiny_models):
    loaded, img = tiny_models["vit"], random_image(8, (32, 32))
    p = activation_patching(loaded, img, random_image(9, (32, 32)), estimate=False, heads=False)
    n_layers, tokens = p.residual.shape
    assert p.forward_equivalents == pytest.approx(2 + tokens * (n_layers - 1) / 2)
    h = activation_patching(loaded, img, random_image(9, (32, 32)), estimate=False, residual=False)
    assert h.forward_equivalents == pytest.approx(2 + 4 * (n_layers + 1) / 2)


def test_progress_and_cancel_keep_the_partial_grid(tiny_models):
    loaded, img = tiny_models["vit"], random_image(10, (32, 32))
    seen = []
    calls = iter([False, False, True])
    with pytest.raises(PatchingCancelled, match="cancelled after") as info:
        activation_patching(
            loaded,
            img,
            random_image(11),
            chunk=4,
            progress=lambda d, t: seen.append((d, t)),
            cancel=lambda: next(calls),
        )
    part = info.value.partial
    assert not part.complete and seen == [(4, 42), (8, 42)]
    assert np.isfinite(part.residual[0, :8]).all() and np.isnan(part.residual[0, 8:]).all()
    assert np.isnan(part.heads).all() and part.heads_estimate is not None


def test_analysis_maths_by_hand():
    g = np.arange(24.0).reshape(2, 3, 4)
    a, s = np.ones((2, 3, 4)), np.full((2, 3, 4), 3.0)
    np.testing.assert_allclose(residual_estimate(g, a, s), 2 * g.sum(-1))
    gz = np.ones((3, 6))
    np.testing.assert_allclose(head_estimate(gz, np.zeros((3, 6)), np.arange(18.0).reshape(3, 6), 2), [63.0, 90.0])
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert rank_correlation([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, rel=1e-6)  # scipy.stats.spearmanr
    assert np.isnan(rank_correlation([1, 1, 1], [1, 2, 3]))


@pytest.mark.parametrize("key", ["vit", "deit"])
def test_per_patch_lens_on_the_cls_token_is_the_logit_lens(key, tiny_models):
    """Row l of the per-patch lens for patch p is the readout of a residual whose every token is patch p; the
    same construction on the CLS token gives the logit lens's rows (by hand: LayerNorm + classifier)."""
    loaded, img = tiny_models[key], random_image(12, (32, 32))
    lens = logit_lens(loaded, img)
    pl = patch_lens(loaded, img, target=2)
    assert pl.shape == (3, 4, 4) and pl.dtype == np.float32
    model = loaded.model
    pt, _ = preprocess(loaded, [img], (32, 32))
    with torch.no_grad():
        hs = model.base_model(pixel_values=pt, output_hidden_states=True).hidden_states  # (L + 1) x (1, T, D)
    norm = model.base_model.layernorm
    p = len(loaded.family.prefix_kinds(loaded.config))
    for r, x in enumerate(hs):
        tok = norm(x[0, p:])  # (N, D)
        if key == "vit":
            by_hand = model.classifier(tok)[:, 2]
            cls_row = model.classifier(norm(x[0, :1]))[0]
        else:
            by_hand = ((model.cls_classifier(tok) + model.distillation_classifier(tok)) / 2)[:, 2]
            cls_row = None
        np.testing.assert_allclose(pl[r].ravel(), by_hand.detach().numpy(), rtol=1e-4, atol=1e-5)
        if cls_row is not None:
            np.testing.assert_allclose(lens.logits[r], cls_row.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_hierarchical_heads_only_with_a_reason_for_the_residual(hier_models):
    loaded = hier_models["swin"]
    img_t, img_s = random_image(13, (64, 64)), random_image(14, (50, 70))
    p = activation_patching(loaded, img_t, img_s, target=0, estimate=False)
    assert p.residual is None and "token grid and width change" in p.notes["residual"]
    assert p.heads.shape[0] == 4 and np.isfinite(p.heads).sum() == 2 * 2 + 2 * 4
    lens = patch_lens(loaded, img_t)  # the last stage's rows only (tests/capture/test_patch_lens_stages.py)
    assert np.isnan(lens[0]).all() and np.isfinite(lens[-1]).all()


def test_families_without_the_point_get_a_message(hier_models):
    loaded = hier_models["mobilevitv2"]
    with pytest.raises(NotDefined, match="no per-head output projection"):
        activation_patching(loaded, random_image(15, (128, 128)), random_image(16, (128, 128)), estimate=False)


def test_inputs_that_differ_between_the_two_runs_get_a_message(modern_dirs):
    """SigLIP 2 NaFlex sizes each image by its aspect ratio: a wide source does not fit a tall target's run."""
    from vitviz.models.load import load_model

    loaded = load_model(str(modern_dirs["siglip2"]), device="cpu")
    with pytest.raises(NotDefined, match="different inputs"):
        activation_patching(loaded, random_image(19, (20, 60)), random_image(20, (60, 20)), estimate=False)
