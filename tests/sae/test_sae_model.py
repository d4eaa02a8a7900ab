"""The SAE's arithmetic against a per-token reimplementation of SAELens' formulas, and its cfg.json layout."""

from __future__ import annotations

import json
import math

import pytest
import torch

from vitviz.sae.model import CFG_FILE, WEIGHTS_FILE, SAEConfig, SAEError, SparseAutoencoder, save_sae


def _random_sae(seed: int = 0, **cfg) -> SparseAutoencoder:
    base = dict(d_in=6, d_sae=10, activation="topk", k=3)
    base.update(cfg)
    sae = SparseAutoencoder(SAEConfig(**base))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    return sae


def _reference(sae: SparseAutoencoder, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Features and reconstruction of each token, one at a time, in float64, as SAELens writes them."""
    c = sae.cfg
    W_enc, b_enc, W_dec, b_dec = (t.detach().double() for t in (sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec))
    fs, xs = [], []
    for tok in x.double().reshape(-1, c.d_in):
        shift, scale = 0.0, 1.0
        v = tok
        if c.normalize_activations == "layer_norm":
            mu = tok.mean()
            std = math.sqrt(((tok - mu) ** 2).sum() / (c.d_in - 1))
            v, shift, scale = (tok - mu) / (std + 1e-5), mu, std
        elif c.normalize_activations == "constant_norm_rescale":
            coeff = math.sqrt(c.d_in) / tok.norm()
            v, scale = tok * coeff, 1.0 / coeff
        pre = (v - b_dec if c.apply_b_dec_to_input else v) @ W_enc + b_enc
        f = torch.zeros_like(pre)
        if c.activation == "relu":
            f = pre.clamp(min=0)
        elif c.activation == "jumprelu":
            th = sae.threshold.detach().double()
            f = torch.where(pre > th, pre.clamp(min=0), torch.zeros_like(pre))
        else:
            for i in sorted(range(len(pre)), key=lambda i: -float(pre[i]))[: c.k]:
                f[i] = max(float(pre[i]), 0.0) if c.topk_relu else float(pre[i])
        fs.append(f)
        xs.append((f @ W_dec + b_dec) * scale + shift)
    shape = x.shape[:-1]
    return torch.stack(fs).reshape(*shape, c.d_sae), torch.stack(xs).reshape(*shape, c.d_in)


@pytest.mark.parametrize(
    "cfg",
    [
        dict(activation="topk", k=3),
        dict(activation="topk", k=3, topk_relu=False),
        dict(activation="relu", k=None),
        dict(activation="jumprelu", k=None),
        dict(activation="relu", k=None, apply_b_dec_to_input=False),
        dict(activation="topk", k=4, normalize_activations="layer_norm"),
        dict(activation="relu", k=None, normalize_activations="constant_norm_rescale"),
    ],
)
def test_encode_decode_match_the_per_token_reference(cfg):
    sae = _random_sae(1, **cfg)
    x = torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(2)) * 3 + 1
    f_ref, x_ref = _reference(sae, x)
    f, stats = sae.encode_with_stats(x)
    assert f.shape == (2, 5, 10)
    torch.testing.assert_close(f.double(), f_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sae.decode(f, stats).double(), x_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sae(x).double(), x_ref, rtol=1e-5, atol=1e-5)


def test_topk_keeps_k_features_and_relu_drops_negatives():
    sae = _random_sae(3, activation="topk", k=4)
    f = sae.encode(torch.randn(50, 6))
    assert int((f != 0).sum(dim=-1).max()) <= 4
    assert bool((f >= 0).all())
    raw = _random_sae(3, activation="topk", k=4, topk_relu=False).encode(torch.randn(50, 6))
    assert bool(((raw != 0).sum(dim=-1) == 4).all())  # saev's TopK: the k largest whatever their sign


def test_decode_of_a_normalising_sae_needs_the_statistics():
    sae = _random_sae(activation="relu", k=None, normalize_activations="layer_norm")
    f = sae.encode(torch.randn(3, 6))
    with pytest.raises(SAEError, match="statistics"):
        sae.decode(f)


def test_width_mismatch_is_a_message():
    sae = _random_sae(point="blocks.2.out")
    with pytest.raises(SAEError, match=r"6 wide .*blocks.2.out.*got 7 wide"):
        sae.encode(torch.randn(2, 7))


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(d_in=0), "d_in"),
        (dict(activation="gated"), "activation"),
        (dict(k=11), "k in 1..d_sae"),
        (dict(normalize_activations="batch"), "normalisation"),
        (dict(tokens="cls"), "tokens"),
    ],
)
def test_bad_configs_are_refused(bad, match):
    with pytest.raises(SAEError, match=match):
        SAEConfig(**{**dict(d_in=6, d_sae=10, k=3), **bad})


def test_saved_folder_is_saelens_layout(tmp_path):
    from safetensors.torch import load_file

    sae = _random_sae(point="blocks.2.out", activation="topk", k=3)
    sae.cfg = sae.cfg.with_(model="demo", tokens="patches", training={"seed": 0})
    save_sae(sae, tmp_path)
    cfg = json.loads((tmp_path / CFG_FILE).read_text())
    # SAELens 6's keys: the architecture, the shapes, the encoding, and the hook in TransformerLens' name
    assert cfg["architecture"] == "topk" and cfg["k"] == 3
    assert (cfg["d_in"], cfg["d_sae"]) == (6, 10)
    assert cfg["apply_b_dec_to_input"] is True and cfg["normalize_activations"] == "none"
    assert cfg["metadata"]["hook_name"] == "blocks.2.hook_resid_post"
    assert cfg["metadata"]["model_name"] == "demo"
    assert cfg["metadata"]["sae_lens_version"].startswith("6.")
    # vitviz's own keys
    assert cfg["vitviz_point"] == "blocks.2.out" and cfg["vitviz_tokens"] == "patches"
    weights = load_file(str(tmp_path / WEIGHTS_FILE))
    assert set(weights) == {"W_enc", "b_enc", "W_dec", "b_dec"}
    assert weights["W_enc"].shape == (6, 10) and weights["W_dec"].shape == (10, 6)
    torch.testing.assert_close(weights["W_dec"], sae.W_dec.detach())


def test_decoder_helpers():
    sae = _random_sae(activation="relu", k=None)
    sae.normalise_decoder()
    torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(10))
    sae.W_dec.grad = torch.randn(10, 6)
    sae.remove_parallel_gradient()
    along = (sae.W_dec.grad * sae.W_dec).sum(dim=1)
    torch.testing.assert_close(along, torch.zeros(10), atol=1e-6, rtol=0)
