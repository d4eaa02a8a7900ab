import numpy as np
import pytest
import torch
from conftest import EXPECTED_PREFIX, FAMILY_KEYS, random_image

from vitviz.capture.forward import (
    capture,
    capture_batch,
    check_budget,
    estimate_capture_bytes,
    input_size_for,
    preprocess,
)
from vitviz.errors import BudgetError, CaptureError


def _qk_reference(loaded, image, size=None) -> np.ndarray:
    """Attention recomputed from the q/k projections: softmax(q k^T / sqrt(d)), (L, H, T, T)."""
    cfg = loaded.config
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    grabbed: dict[str, torch.Tensor] = {}
    handles = []
    for name, mod in loaded.model.named_modules():
        if name.endswith("attention.q_proj") or name.endswith("attention.k_proj"):
            handles.append(mod.register_forward_hook(lambda m, i, o, name=name: grabbed.__setitem__(name, o.detach())))
    try:
        pixels, _ = preprocess(loaded, [image], input_size_for(loaded, size))
        kwargs = {"interpolate_pos_encoding": True} if loaded.family.interpolate_kwarg else {}
        with torch.no_grad():
            loaded.model(pixel_values=pixels, **kwargs)
    finally:
        for h in handles:
            h.remove()
    layers = sorted({n.rsplit(".", 2)[0] for n in grabbed}, key=lambda n: int(n.rsplit(".", 1)[1]))
    out = []
    for layer in layers:
        q = grabbed[f"{layer}.attention.q_proj"][0].view(-1, heads, d).transpose(0, 1)
        k = grabbed[f"{layer}.attention.k_proj"][0].view(-1, heads, d).transpose(0, 1)
        out.append(torch.softmax(q @ k.transpose(-1, -2) / d**0.5, dim=-1).numpy())
    return np.stack(out)


@pytest.mark.parametrize("key", FAMILY_KEYS)
def test_attention_equals_recomputed_from_queries_and_keys(tiny_models, key):
    loaded = tiny_models[key]
    img = random_image(1)
    cap = capture(loaded, img, attention_dtype="float32")
    ref = _qk_reference(loaded, img)
    assert cap.attentions.shape == ref.shape
    np.testing.assert_allclose(cap.attentions, ref, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(cap.attentions.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("key", FAMILY_KEYS)
def test_token_layout_and_grid(tiny_models, key):
    loaded = tiny_models[key]
    cap = capture(loaded, random_image(2))
    p = loaded.patch_size
    assert cap.prefix_kinds == EXPECTED_PREFIX[key]
    assert cap.num_prefix_tokens == len(EXPECTED_PREFIX[key])
    assert cap.grid == (32 // p, 32 // p)
    assert cap.num_tokens == cap.num_prefix_tokens + cap.grid[0] * cap.grid[1]
    assert cap.token_norms.shape == (cap.num_layers + 1, cap.num_tokens)
    assert cap.image.shape == (32, 32, 3) and cap.image.dtype == np.uint8
    assert cap.patch_weights.shape == (32, 3, p, p)
    assert cap.token_label(cap.num_prefix_tokens + cap.grid[1] + 1) == "patch (1, 1)"


@pytest.mark.parametrize("key", FAMILY_KEYS)
def test_non_square_and_other_sizes_interpolate(tiny_models, key):
    loaded = tiny_models[key]
    p = loaded.patch_size
    img = random_image(3, size=(100, 60))
    cap = capture(loaded, img, size=(3 * p * 2, 5 * p * 2), attention_dtype="float32")
    assert cap.grid == (6, 10) and cap.input_size == (6 * p, 10 * p)
    assert cap.num_tokens == cap.num_prefix_tokens + 60
    np.testing.assert_allclose(cap.attentions, _qk_reference(loaded, img, (6 * p, 10 * p)), rtol=1e-4, atol=1e-6)


def test_matches_output_attentions_of_transformers(tiny_models):
    loaded = tiny_models["deit"]
    img = random_image(5)
    pixels, _ = preprocess(loaded, [img], input_size_for(loaded))
    with torch.no_grad():
        ref = loaded.model(pixel_values=pixels, output_attentions=True).attentions
    cap = capture(loaded, img)  # default float16 storage
    assert cap.attention_precision == "float16"
    np.testing.assert_allclose(cap.attentions.astype(np.float32), torch.cat(ref).numpy(), atol=1e-3)


def test_predictions_are_softmax_top_k(tiny_models):
    cap = capture(tiny_models["vit"], random_image(6), top_k=2)
    probs = np.exp(cap.logits - cap.logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs)
    assert [p.index for p in cap.predictions] == order[:2].tolist()
    assert cap.predictions[0].probability == pytest.approx(probs[order[0]])
    assert cap.predictions[0].label == tiny_models["vit"].id2label[order[0]]
    assert capture(tiny_models["dino"], random_image(6)).predictions == ()


def _hook_count(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_record_is_immutable_and_model_keeps_no_hooks(tiny_models):
    loaded = tiny_models["vit"]
    capture(loaded, random_image(7))  # transformers installs its own (context-local) recorders once
    before = _hook_count(loaded.model)
    cap = capture(loaded, random_image(7))
    capture(loaded, random_image(8))
    with pytest.raises(ValueError):
        cap.attentions[0, 0, 0, 0] = 1.0
    with pytest.raises(AttributeError):
        cap.grid = (1, 1)
    assert _hook_count(loaded.model) == before


def test_batch_equals_single(tiny_models):
    loaded = tiny_models["dinov2_registers"]
    imgs = [random_image(s) for s in range(3)]
    batch = capture_batch(loaded, imgs, attention_dtype="float32")
    for img, cap in zip(imgs, batch, strict=True):
        np.testing.assert_allclose(
            cap.attentions, capture(loaded, img, attention_dtype="float32").attentions, atol=1e-5
        )


def test_budget_refuses_huge_inputs(tiny_models):
    loaded = tiny_models["vit"]
    assert estimate_capture_bytes(12, 12, 197) == 12 * 12 * 197**2 * 4
    assert estimate_capture_bytes(12, 12, 197, gradients=True) == 2 * 12 * 12 * 197**2 * 4
    with pytest.raises(BudgetError, match="smaller input size"):
        capture(loaded, random_image(0), size=512, budget_bytes=10_000)


def test_nothing_captured_raises(tiny_dirs):
    from vitviz.models.load import load_model

    loaded = load_model(str(tiny_dirs["vit"]))
    loaded.model.set_attn_implementation("sdpa")  # a private copy: simulate fused attention
    with pytest.raises(CaptureError, match="eager"):
        capture(loaded, random_image(0))


def test_sixteen_concurrent_analyses_equal_the_ones_computed_alone(tiny_models):
    from concurrent.futures import ThreadPoolExecutor

    loaded = tiny_models["deit"]
    images = [random_image(100 + i, size=(40 + i, 32 + 2 * i)) for i in range(16)]
    alone = [capture(loaded, img, attention_dtype="float32") for img in images]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(lambda img: capture(loaded, img, attention_dtype="float32"), images * 2))
    for i, cap in enumerate(together):
        ref = alone[i % 16]
        np.testing.assert_allclose(cap.attentions, ref.attentions, atol=1e-6)
        np.testing.assert_allclose(cap.logits, ref.logits, atol=1e-5)
        assert cap.token_norms.shape == ref.token_norms.shape


def test_failure_halfway_leaves_no_hook_and_next_call_is_correct(tiny_dirs):
    from vitviz.models.load import load_model

    loaded = load_model(str(tiny_dirs["vit"]))
    img = random_image(9)
    expected = capture(loaded, img, attention_dtype="float32")
    hooks = _hook_count(loaded.model)
    second_layer = loaded.base_model.layers[1]
    original = second_layer.forward

    def broken(*args, **kwargs):
        raise RuntimeError("simulated failure in layer 1")

    second_layer.forward = broken
    try:
        with pytest.raises(RuntimeError, match="simulated"):
            capture(loaded, img)
    finally:
        second_layer.forward = original
    assert _hook_count(loaded.model) == hooks
    again = capture(loaded, img, attention_dtype="float32")
    np.testing.assert_array_equal(again.attentions, expected.attentions)


def test_model_with_no_attention_layers_is_named(tmp_path):
    from transformers import ViTConfig, ViTModel

    from vitviz.models.load import load_model

    cfg = ViTConfig(
        hidden_size=16, num_hidden_layers=0, num_attention_heads=2, intermediate_size=32, image_size=16, patch_size=8
    )
    ViTModel(cfg).save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(CaptureError, match="no attention weights"):
        capture(load_model(str(tmp_path)), random_image(0))


def test_dinov2_base_shape_at_518_fits_the_default_budget(tmp_path):
    """ViT-B-sized DINOv2 at 518 px (T = 1370): within 2 GiB, stored as float16."""
    from transformers import Dinov2Config, Dinov2Model

    from vitviz.models.load import load_model

    torch.manual_seed(0)
    Dinov2Model(Dinov2Config(image_size=518, patch_size=14)).save_pretrained(tmp_path, safe_serialization=True)
    loaded = load_model(str(tmp_path))
    need = estimate_capture_bytes(12, 12, 1370)
    assert need < 2 * 1024**3
    cap = capture(loaded, random_image(0, size=(600, 500)), size=518)
    assert cap.num_tokens == 1370 and cap.grid == (37, 37)
    assert cap.attention_precision == "float16"
    assert cap.attentions.nbytes == need // 2
    with pytest.raises(BudgetError):
        capture(loaded, random_image(0), size=518, budget_bytes=need - 1)
    with pytest.raises(BudgetError, match="smaller input size"):  # gradients double it past 2 GiB
        check_budget(loaded, (518, 518), batch=1, gradients=True, budget=2 * 1024**3)


def test_token_norms_match_the_hidden_states(tiny_models):
    loaded = tiny_models["dinov2_registers"]
    img = random_image(11)
    cap = capture(loaded, img)
    pixels, _ = preprocess(loaded, [img], input_size_for(loaded))
    with torch.no_grad():
        hidden = loaded.model(pixel_values=pixels, output_hidden_states=True).hidden_states
    ref = np.stack([np.sqrt((h[0].numpy().astype(np.float64) ** 2).sum(-1)) for h in hidden])
    np.testing.assert_allclose(cap.token_norms, ref, rtol=1e-5)


def _counting_lender(monkeypatch) -> list:
    """Wrap the attention function's lender: each call's answer (a buffer's address, or None) goes in the list."""
    from vitviz.models import attention

    real, answers = attention._lender, []
    assert real is not None  # set when a model is installed

    def counting(module, shape, dtype, device):
        buf = real(module, shape, dtype, device)
        answers.append(None if buf is None else buf.data_ptr())
        return buf

    monkeypatch.setattr(attention, "_lender", counting)
    return answers


@pytest.mark.parametrize("key", FAMILY_KEYS)
def test_a_capture_computes_every_block_in_one_lent_buffer_with_the_same_numbers(tiny_models, key, monkeypatch):
    from vitviz.models import attention

    loaded, img = tiny_models[key], random_image(3)
    answers = _counting_lender(monkeypatch)
    got = capture(loaded, img, attention_dtype="float32")
    assert len(answers) == got.num_blocks and None not in answers and len(set(answers)) == 1  # one buffer, reused
    monkeypatch.setattr(attention, "_lender", None)  # every block in fresh tensors, as eager attention does
    ref = capture(loaded, img, attention_dtype="float32")
    np.testing.assert_array_equal(got.attentions, ref.attentions)  # bit for bit, and no block aliases another
    for a, b in zip(got.blocks, ref.blocks, strict=True):
        np.testing.assert_array_equal(a.fused, b.fused)
        for x, y in zip(a.summaries.get(), b.summaries.get(), strict=True):
            np.testing.assert_array_equal(x, y)
    assert len({float(b.attention[0, 0, 0]) for b in got.blocks}) > 1  # blocks differ: the check above can fail


def test_no_buffer_is_lent_where_the_probabilities_outlive_the_block(tiny_models, monkeypatch):
    from vitviz.capture.run import clear_runs, get_run
    from vitviz.models.hooks import active

    loaded, img = tiny_models["vit"], random_image(4)
    answers = _counting_lender(monkeypatch)
    clear_runs()
    get_run(loaded, img)  # a graph: backward reads every block's probabilities
    get_run(loaded, img, size=32, gradients=False)  # no graph, but summaries computed from them when first read
    with active(loaded, record=["blocks.0.attn.pattern"]):  # a record of a pattern holds it
        capture(loaded, img)
    assert answers and set(answers[: -loaded.config.num_hidden_layers]) == {None}
    assert answers[-loaded.config.num_hidden_layers] is None  # the recorded block's own buffer: none
    clear_runs()


def test_offered_heights_are_the_factors_of_the_models_own_in_whole_patches(tiny_models, demo_model):
    from vitviz.capture.forward import offered_heights

    assert offered_heights(demo_model) == [48, 72, 96, 120, 144, 192]  # 96 px, 8 px patches: 0.5x .. 2x
    tiny = tiny_models["vit"]  # 32 px, 8 px patches: 16 and 24 px round to 16 and 24, 40 to 40
    assert offered_heights(tiny) == [16, 24, 32, 40, 48, 64]
