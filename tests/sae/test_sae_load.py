"""Reading SAEs: tiny folders written here in SAELens', ViT-Prisma's and saev's layouts, and the refusals."""

from __future__ import annotations

import dataclasses
import io
import json
import sys
import types
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vitviz.sae.load import load_sae, point_from_hook_name
from vitviz.sae.model import SAEConfig, SAEError, SparseAutoencoder, save_sae

D_IN, D_SAE = 8, 12


def _weights(seed: int = 0, *, threshold: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = {
        "W_enc": torch.randn(D_IN, D_SAE, generator=g),
        "b_enc": torch.randn(D_SAE, generator=g),
        "W_dec": torch.randn(D_SAE, D_IN, generator=g),
        "b_dec": torch.randn(D_IN, generator=g),
    }
    if threshold:
        w["threshold"] = torch.rand(D_SAE, generator=g)
    return w


def _saelens(folder: Path, cfg: dict, weights: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    save_file(weights, str(folder / "sae_weights.safetensors"))
    return folder


def _x(seed: int = 5) -> torch.Tensor:
    return torch.randn(4, D_IN, generator=torch.Generator().manual_seed(seed))


def _pre(w: dict, x: torch.Tensor, *, sub: bool = True) -> torch.Tensor:
    return ((x - w["b_dec"]) if sub else x) @ w["W_enc"] + w["b_enc"]


# --- SAELens ---------------------------------------------------------------------------------------------


def test_saelens_6_topk_folder(tmp_path):
    w = _weights()
    cfg = {
        "architecture": "topk",
        "d_in": D_IN,
        "d_sae": D_SAE,
        "k": 3,
        "dtype": "float32",
        "apply_b_dec_to_input": True,
        "normalize_activations": "none",
        "metadata": {"sae_lens_version": "6.5.1", "hook_name": "blocks.1.hook_resid_post", "model_name": "m"},
    }
    sae = load_sae(_saelens(tmp_path / "s", cfg, w))
    assert sae.cfg.point == "blocks.1.out" and sae.cfg.source == "saelens" and sae.cfg.model == "m"
    pre = _pre(w, _x())
    top = torch.topk(pre, 3, dim=-1)
    want = torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
    torch.testing.assert_close(sae.encode(_x()), want)


def test_saelens_pre_6_relu_and_topk_keys(tmp_path):
    w = _weights(1)
    old = {"d_in": D_IN, "d_sae": D_SAE, "hook_point": "blocks.0.hook_mlp_out", "activation_fn_str": "relu"}
    sae = load_sae(_saelens(tmp_path / "relu", old, w))
    assert sae.cfg.activation == "relu" and sae.cfg.point == "blocks.0.mlp.out"
    torch.testing.assert_close(sae.encode(_x()), _pre(w, _x()).relu())
    old_topk = {**old, "activation_fn_str": "topk", "activation_fn_kwargs": {"k": 2}, "normalize_activations": True}
    sae = load_sae(_saelens(tmp_path / "topk", old_topk, w))
    assert sae.cfg.activation == "topk" and sae.cfg.k == 2
    assert sae.cfg.normalize_activations == "none" and "expected_average_only_in" in sae.cfg.notes[0]


def test_saelens_jumprelu(tmp_path):
    w = _weights(2, threshold=True)
    cfg = {
        "architecture": "jumprelu",
        "d_in": D_IN,
        "d_sae": D_SAE,
        "metadata": {"hook_name": "blocks.3.hook_attn_out"},
    }
    sae = load_sae(_saelens(tmp_path / "j", cfg, w))
    pre = _pre(w, _x())
    torch.testing.assert_close(sae.encode(_x()), pre.relu() * (pre > w["threshold"]))
    assert sae.cfg.point == "blocks.3.attn.out"


def test_vitviz_folder_round_trip(tmp_path):
    sae = SparseAutoencoder(SAEConfig(d_in=D_IN, d_sae=D_SAE, k=4, point="blocks.2.out", model="demo", tokens="all"))
    with torch.no_grad():
        sae.load_state_dict(_weights(3))
    back = load_sae(save_sae(sae, tmp_path / "v"))
    assert back.cfg.source == "vitviz" and back.cfg.point == "blocks.2.out" and back.cfg.tokens == "all"
    assert back.cfg.model == "demo"
    torch.testing.assert_close(back.encode(_x()), sae.encode(_x()))
    assert not any(p.requires_grad for p in back.parameters())


def test_point_override_and_hook_names():
    assert point_from_hook_name("blocks.9.hook_resid_post") == "blocks.9.out"
    assert point_from_hook_name("blocks.9.hook_resid_pre") == "blocks.9.in"
    assert point_from_hook_name("blocks.4.attn.hook_z") == "blocks.4.attn.z"
    assert point_from_hook_name("blocks.4.mlp.out") == "blocks.4.mlp.out"
    with pytest.raises(SAEError, match="no point there"):
        point_from_hook_name("blocks.4.mlp.hook_post")


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda w: w.update(extra=torch.zeros(3)), "unknown weights extra"),
        (lambda w: w.pop("b_dec"), "missing weights b_dec"),
        (lambda w: w.update(W_dec=torch.zeros(D_SAE, D_IN + 1)), "W_dec has shape"),
        (lambda w: w["W_enc"].__setitem__((0, 0), float("nan")), "non-finite"),
        (lambda w: w["b_enc"].__setitem__(1, float("inf")), "non-finite"),
    ],
)
def test_damaged_weights_are_refused(tmp_path, change, match):
    w = _weights()
    change(w)
    cfg = {
        "architecture": "standard",
        "d_in": D_IN,
        "d_sae": D_SAE,
        "metadata": {"hook_name": "blocks.0.hook_resid_post"},
    }
    with pytest.raises(SAEError, match=match):
        load_sae(_saelens(tmp_path / "bad", cfg, w))


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({"architecture": "gated"}, "architecture 'gated'"),
        ({"architecture": "topk", "k": 2, "rescale_acts_by_decoder_norm": True}, "rescale_acts_by_decoder_norm"),
        (
            {"architecture": "standard", "metadata": {"hook_name": "blocks.0.attn.hook_z", "hook_head_index": 2}},
            "one head",
        ),
    ],
)
def test_unsupported_configs_are_refused(tmp_path, cfg, match):
    with pytest.raises(SAEError, match=match):
        load_sae(_saelens(tmp_path / "u", {"d_in": D_IN, "d_sae": D_SAE, **cfg}, _weights()))


def test_missing_paths_and_hub_ids(tmp_path):
    with pytest.raises(SAEError, match="does not fetch SAEs from the Hugging Face Hub"):
        load_sae("someone/some-sae")
    with pytest.raises(SAEError, match="does not exist"):
        load_sae(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SAEError, match="holds no SAE"):
        load_sae(tmp_path / "empty")


def test_point_the_model_lacks(tmp_path, demo_model):
    cfg = {
        "architecture": "standard",
        "d_in": D_IN,
        "d_sae": D_SAE,
        "metadata": {"hook_name": "blocks.9.hook_resid_post"},
    }
    with pytest.raises(SAEError, match=r"blocks.9.out, which 'demo' does not have"):
        load_sae(_saelens(tmp_path / "p", cfg, _weights()), loaded=demo_model)


# --- ViT-Prisma -------------------------------------------------------------------------------------------


@pytest.fixture
def prisma_module(monkeypatch):
    """A stand-in for ``vit_prisma.sae.config`` so that a test can pickle a config object as ViT-Prisma does."""

    @dataclasses.dataclass
    class VisionModelSAERunnerConfig:
        d_in: int = D_IN
        hook_point_layer: int = 2
        device: str = "cpu"
        dtype: torch.dtype = torch.float32

    names = ("vit_prisma", "vit_prisma.sae", "vit_prisma.sae.config")
    mods = {n: types.ModuleType(n) for n in names}
    VisionModelSAERunnerConfig.__module__ = "vit_prisma.sae.config"
    VisionModelSAERunnerConfig.__qualname__ = "VisionModelSAERunnerConfig"
    mods["vit_prisma.sae.config"].VisionModelSAERunnerConfig = VisionModelSAERunnerConfig
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)
    return VisionModelSAERunnerConfig


def _prisma_config(folder: Path, **extra) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "d_in": D_IN,
        "expansion_factor": D_SAE // D_IN if D_SAE % D_IN == 0 else None,
        "d_sae": D_SAE,
        "hook_point_layer": 2,
        "layer_subtype": "hook_resid_post",
        "activation_fn_str": "relu",
        "activation_fn_kwargs": {},
        "model_name": "open-clip:laion/CLIP-ViT-B-32",
        "use_patches_only": False,
        "dtype": {"__type__": "torch.dtype", "value": "torch.float32"},
        **extra,
    }
    (folder / "config.json").write_text(json.dumps(cfg))


def test_prisma_weights_with_pickled_config(tmp_path, prisma_module):
    folder = tmp_path / "prisma"
    _prisma_config(folder)  # no normalize_activations: ViT-Prisma's default, layer_norm
    w = _weights(4)
    torch.save({"cfg": prisma_module(), "state_dict": OrderedDict(w)}, folder / "weights.pt")
    sae = load_sae(folder)
    assert sae.cfg.source == "prisma" and sae.cfg.point == "blocks.2.out" and sae.cfg.tokens == "all"
    assert sae.cfg.normalize_activations == "layer_norm" and "default" in sae.cfg.notes[0]
    x = _x()
    mu = x.mean(-1, keepdim=True)
    std = (x - mu).std(-1, keepdim=True)
    torch.testing.assert_close(sae.encode(x), _pre(w, (x - mu) / (std + 1e-5)).relu())


def test_prisma_topk_plain_state_dict(tmp_path):
    folder = tmp_path / "p2"
    _prisma_config(folder, activation_fn_str="topk", activation_fn_kwargs={"k": 2}, normalize_activations="none")
    torch.save(_weights(5), folder / "n_images_1000.pt")
    sae = load_sae(folder / "n_images_1000.pt")
    assert sae.cfg.activation == "topk" and sae.cfg.k == 2 and sae.cfg.normalize_activations == "none"
    torch.save(_weights(6), folder / "n_images_2000.pt")
    with pytest.raises(SAEError, match="several ViT-Prisma checkpoints"):
        load_sae(folder)


class _Payload:
    """A pickle that runs code when loaded: it would create a file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_a_pickle_that_carries_code_is_refused_and_never_run(tmp_path):
    folder = tmp_path / "evil"
    _prisma_config(folder, normalize_activations="none")
    ran = tmp_path / "code-ran"
    torch.save({"state_dict": _weights(), "x": _Payload(ran)}, folder / "weights.pt")
    with pytest.raises(SAEError, match=r"needs code to load .*never runs code"):
        load_sae(folder)
    assert not ran.exists()


# --- saev -------------------------------------------------------------------------------------------------


def _saev(path: Path, header: dict, state: dict) -> Path:
    buf = io.BytesIO()
    torch.save(state, buf)
    path.write_bytes(json.dumps(header).encode() + b"\n" + buf.getvalue())
    return path


def _saev_header(activation: dict) -> dict:
    return {"schema": 5, "cfg": {"d_model": D_IN, "d_sae": D_SAE, "activation": activation}, "commit": "x"}


def test_saev_topk_keeps_raw_values(tmp_path):
    w = _weights(7)
    path = _saev(tmp_path / "sae.pt", _saev_header({"cls": "TopK", "params": {"top_k": 3}}), w)
    with pytest.raises(SAEError, match="does not say which layer"):
        load_sae(path)
    sae = load_sae(tmp_path, point="blocks.10.hook_resid_post")  # the folder holding sae.pt; a TL name mapped
    assert sae.cfg.source == "saev" and sae.cfg.point == "blocks.10.out"
    pre = _pre(w, _x(), sub=False)  # saev subtracts no b_dec
    top = torch.topk(pre, 3, dim=-1)
    torch.testing.assert_close(sae.encode(_x()), torch.zeros_like(pre).scatter(-1, top.indices, top.values))


def test_saev_relu_and_batch_topk(tmp_path):
    w = _weights(8)
    sae = load_sae(_saev(tmp_path / "r.pt", _saev_header({"cls": "Relu", "params": {}}), w), point="blocks.1.out")
    torch.testing.assert_close(sae.encode(_x()), _pre(w, _x(), sub=False).relu())
    state = {**w, "activation.threshold": torch.tensor(0.7)}
    sae = load_sae(
        _saev(tmp_path / "b.pt", _saev_header({"cls": "BatchTopK", "params": {"top_k": 4}}), state),
        point="blocks.1.out",
    )
    pre = _pre(w, _x(), sub=False)
    torch.testing.assert_close(sae.encode(_x()), torch.where(pre > 0.7, pre, torch.zeros_like(pre)))
    legacy = {"d_vit": D_IN, "d_sae": D_SAE, "seed": 0}
    sae = load_sae(_saev(tmp_path / "old.pt", legacy, w), point="blocks.1.out")
    assert sae.cfg.activation == "relu"
