"""The completed registry: q/k/v, attn.out, resid_mid and editable patterns equal plain forward hooks; add, scale and fn
edits by hand; vitviz's attention function computes eager attention's numbers; records taken in an edited forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import random_image

from vitviz.capture.forward import capture, input_size_for, preprocess
from vitviz.capture.run import get_run
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


def _out(output) -> torch.Tensor:
    """Class logits, or a backbone's last hidden state."""
    return output.logits if hasattr(output, "logits") else output.last_hidden_state


def _layers(loaded):
    return [s.block for s in H.installed_sites(loaded.model)]


@pytest.mark.parametrize("key", ["vit", "deit", "dinov2", "dinov2_registers", "beit"])
def test_new_points_equal_plain_forward_hooks(tiny_models, key):
    """q, k, v are the projections' outputs, attn.out the output projection's, resid_mid the MLP norm's input."""
    loaded = tiny_models[key]
    pixels, hw = _pixels(loaded, random_image(11))
    got: dict[str, torch.Tensor] = {}
    handles = []
    for i, layer in enumerate(_layers(loaded)):
        att = layer.attention
        for part in ("q", "k", "v"):
            proj = getattr(att, f"{part}_proj")
            handles.append(proj.register_forward_hook(lambda m, a, o, n=f"blocks.{i}.attn.{part}": got.update({n: o})))
        handles.append(att.o_proj.register_forward_hook(lambda m, a, o, n=f"blocks.{i}.attn.out": got.update({n: o})))
        norm = getattr(layer, "layernorm_after", None) or layer.norm2
        handles.append(norm.register_forward_pre_hook(lambda m, a, n=f"blocks.{i}.resid_mid": got.update({n: a[0]})))
    try:
        plain = _out(_forward(loaded, pixels, hw))
    finally:
        for h in handles:
            h.remove()
    names = set(H.installed_points(loaded.model).names())
    with H.active(loaded, record=None) as state:
        logits = _out(_forward(loaded, pixels, hw))
    torch.testing.assert_close(logits, plain, rtol=0, atol=0)
    for name, ref in got.items():
        if name.endswith("resid_mid") and name not in names:
            assert key == "beit", name  # BEiT multiplies by its layer scale inside the layer: no branch module
            continue
        torch.testing.assert_close(state.values[name], ref, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("key", ["vit", "dinov2", "beit"])
def test_vitviz_attention_is_eager_attention(tiny_models, tiny_dirs, key):
    """The loaded model runs vitviz's attention function; logits and probabilities equal transformers' eager ones."""
    import transformers

    loaded = tiny_models[key]
    assert loaded.model.config._attn_implementation == "vitviz"
    arch = type(loaded.model).__name__
    eager = getattr(transformers, arch).from_pretrained(tiny_dirs[key], attn_implementation="eager").eval()
    pixels, hw = _pixels(loaded, random_image(12))
    kwargs = loaded.family.model_inputs(loaded, pixels, hw)
    with torch.no_grad():
        ref = eager(**kwargs, output_attentions=True)
        mine = _forward(loaded, pixels, hw)
    torch.testing.assert_close(_out(mine), _out(ref), rtol=0, atol=0)
    cap = capture(loaded, random_image(12), attention_dtype="float32")
    for i, a in enumerate(ref.attentions):
        np.testing.assert_allclose(cap.blocks[i].attention, a[0].numpy(), rtol=0, atol=0)


def _eager_pattern_reference(loaded, pixels, hw, layer: int, head: int, pattern: torch.Tensor) -> torch.Tensor:
    """Logits with head ``head``'s probabilities in block ``layer`` replaced by ``pattern`` (T, T), computed by a plain
    forward hook that recomputes the attention module's output from its own projections."""
    att = _layers(loaded)[layer].attention
    heads = loaded.model.config.num_attention_heads

    def hook(module, args, kwargs, output):
        x = args[0] if args else kwargs["hidden_states"]
        b, t, _ = x.shape
        split = lambda y: y.reshape(b, t, heads, -1).transpose(1, 2)  # noqa: E731
        q, k, v = split(module.q_proj(x)), split(module.k_proj(x)), split(module.v_proj(x))
        a = torch.softmax(q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5, dim=-1)
        a = a.clone()
        a[:, head] = pattern
        z = (a @ v).transpose(1, 2).reshape(b, t, -1)
        return (module.o_proj(z), a)

    handle = att.register_forward_hook(hook, with_kwargs=True)
    try:
        return _forward(loaded, pixels, hw).logits
    finally:
        handle.remove()


def test_pattern_edit_equals_a_hand_replacement(tiny_models):
    loaded = tiny_models["vit"]
    pixels, hw = _pixels(loaded, random_image(13))
    with H.active(loaded, record=["blocks.0.attn.pattern"]) as state:
        clean = _forward(loaded, pixels, hw).logits
    t = state.values["blocks.0.attn.pattern"].shape[-1]
    uniform = torch.full((t, t), 1.0 / t)
    edit = P.Edit("blocks.0.attn.pattern", "replace", uniform, heads=(1,))
    with H.active(loaded, edits=[edit], record=["blocks.0.attn.pattern"]) as state:
        got = _forward(loaded, pixels, hw).logits
    torch.testing.assert_close(state.values["blocks.0.attn.pattern"][0, 1], uniform)
    ref = _eager_pattern_reference(loaded, pixels, hw, 0, 1, uniform)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, clean)


def test_add_scale_and_fn_by_hand(tiny_models):
    loaded = tiny_models["vit"]
    pixels, hw = _pixels(loaded, random_image(14))
    with H.active(loaded, record=None) as clean:
        _forward(loaded, pixels, hw)
    x0 = clean.values["blocks.0.out"]
    v = torch.linspace(-1, 1, x0.shape[-1])
    cases = [
        (P.Edit("blocks.0.out", "add", v, tokens=(2,)), lambda x: x.index_add(1, torch.tensor([2]), v[None, None])),
        (P.Edit("blocks.0.out", "scale", 0.5), lambda x: x * 0.5),
        (P.Edit("blocks.0.out", "fn", lambda x: x.flip(1)), lambda x: x.flip(1)),
    ]
    for edit, by_hand in cases:
        with H.active(loaded, edits=[edit], record=["blocks.0.out", "blocks.1.in"]) as state:
            _forward(loaded, pixels, hw)
        torch.testing.assert_close(state.values["blocks.0.out"], by_hand(x0), msg=edit.op)
        torch.testing.assert_close(state.values["blocks.1.in"], by_hand(x0), rtol=0, atol=0, msg=edit.op)
    z = clean.values["blocks.1.attn.z"]
    with H.active(
        loaded,
        edits=[P.Edit("blocks.1.attn.z", "scale", 2.0, heads=(3,))],
        num_heads={"blocks.1.attn.z": 4},
        record=["blocks.1.attn.z"],
    ) as state:
        _forward(loaded, pixels, hw)
    d = z.shape[-1] // 4
    torch.testing.assert_close(state.values["blocks.1.attn.z"][..., 3 * d :], 2 * z[..., 3 * d :])
    torch.testing.assert_close(state.values["blocks.1.attn.z"][..., : 3 * d], z[..., : 3 * d], rtol=0, atol=0)
    bad = P.Edit("blocks.0.out", "fn", lambda x: x[:, :1])
    with pytest.raises(ValueError, match="must return a tensor of shape"), H.active(loaded, edits=[bad]):
        _forward(loaded, pixels, hw)
    with pytest.raises(ValueError, match="needs a value"):
        P.Edit("blocks.0.out", "add")


def test_resid_mid_edit_moves_the_attention_update(tiny_models):
    """Editing resid_mid changes what the MLP reads and what the residual carries, by the edit's difference."""
    loaded = tiny_models["dinov2"]
    pixels, hw = _pixels(loaded, random_image(15))
    with H.active(loaded, record=None) as clean:
        _forward(loaded, pixels, hw)
    mid = clean.values["blocks.0.resid_mid"]
    torch.testing.assert_close(mid, clean.values["blocks.0.in"] + clean.values["blocks.0.attn.out"] * _scale(loaded))
    edit = P.Edit("blocks.0.resid_mid", "zero", tokens=(0,))
    with H.active(loaded, edits=[edit], record=None) as state:
        _forward(loaded, pixels, hw)
    assert torch.all(state.values["blocks.0.resid_mid"][0, 0].abs() < 1e-5)
    torch.testing.assert_close(state.values["blocks.0.resid_mid"][0, 1:], mid[0, 1:], rtol=0, atol=1e-6)


def _scale(loaded):
    return _layers(loaded)[0].layer_scale1.lambda1


def test_edited_records_and_replay_after_an_output_edit(tiny_models):
    """Run.edited records what the edited forward used; an edit of a block's output replays from the next block and
    gives the same scores and records as a full forward."""
    loaded = tiny_models["vit"]
    img = random_image(16)
    run = get_run(loaded, img)
    v = torch.ones(run.activation("blocks.0.out").shape[-1])
    edits = [P.Edit("blocks.0.out", "add", v, tokens=(1,), rows=(1,))]
    record = ["blocks.0.out", "blocks.1.in", "blocks.1.attn.pattern", "blocks.1.out", "embed.out"]
    fast = run.edited(edits, batch=2, record=record)
    full = run.edited(edits, batch=2, record=record, reuse_prefix=False)
    assert fast.replayed and not full.replayed
    assert fast.forward_equivalents == pytest.approx(2 * 1 / 2)  # block 1 of 2 only, two copies
    torch.testing.assert_close(fast.scores, full.scores, rtol=1e-5, atol=1e-6)
    for name in record:
        torch.testing.assert_close(fast.records[name], full.records[name], rtol=1e-5, atol=1e-6, msg=name)
    torch.testing.assert_close(fast.records["blocks.0.out"][1, 1], run.activation("blocks.0.out")[0, 1] + v)
    torch.testing.assert_close(fast.records["blocks.1.out"][0], run.activation("blocks.1.out")[0], rtol=1e-5, atol=1e-6)


def test_points_follow_the_declared_layout(hier_dirs):
    """Swin v1 runs vitviz's attention function (its pattern is editable); MobileViT V2's q, k, v come from one
    convolution, so it has no q point."""
    from vitviz.models.load import load_model

    swin = load_model(str(hier_dirs["swin"]), device="cpu")
    assert H.installed_points(swin.model).by_name["stages.0.blocks.0.attn.pattern"].editable
    mv2 = load_model(str(hier_dirs["mobilevitv2"]), device="cpu")
    assert "stages.0.blocks.0.attn.q" not in H.installed_points(mv2.model)
