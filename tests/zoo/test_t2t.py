"""T2T-ViT (vitviz.zoo.t2t and its family adapter) against the authors' own code, on tiny random-weight models.

``Authors*`` below is yitu-opensource/T2T-ViT's ``models/t2t_vit.py``, ``token_transformer.py``,
``token_performer.py`` and ``transformer_block.py`` (Clear BSD licence), copied with only timm's
helpers removed (DropPath and dropout are identities in eval mode, init is the test's own). Their
state dicts, saved as the authors' training script saves them, go through ``python -m vitviz
convert``; the converted folder must give the authors' logits. Attention is recomputed from each
block's own projections (test-local forward hooks), merges and rollout from ``tests/reference.py``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import random_image
from reference import centres, mean_distance_reference, merge_matrix, relevance_reference, rollout_reference

from vitviz.__main__ import main
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture, capture_batch, input_size_for, preprocess
from vitviz.capture.gradients import explain_classes
from vitviz.errors import BudgetError
from vitviz.models.families import family_for
from vitviz.models.families.t2t import implied_attention
from vitviz.models.load import load_model
from vitviz.zoo import t2t
from vitviz.zoo.convert import Converter, ConvertError, official_names

SIZE = 48  # soft splits: 12 x 12, 6 x 6, then 3 x 3 backbone tokens
TINY = dict(embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0, token_dim=8)


# --- the authors' code (timm helpers removed) ------------------------------------------------------------


class AuthorsMlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU, drop=0.0):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x):
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class AuthorsAttention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_scale=None):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = qk_scale or head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class AuthorsBlock(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=False, qk_scale=None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = AuthorsAttention(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = AuthorsMlp(in_features=dim, hidden_features=int(dim * mlp_ratio))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def get_sinusoid_encoding(n_position, d_hid):
    def get_position_angle_vec(position):
        return [position / np.power(10000, 2 * (hid_j // 2) / d_hid) for hid_j in range(d_hid)]

    sinusoid_table = np.array([get_position_angle_vec(pos_i) for pos_i in range(n_position)])
    sinusoid_table[:, 0::2] = np.sin(sinusoid_table[:, 0::2])
    sinusoid_table[:, 1::2] = np.cos(sinusoid_table[:, 1::2])
    return torch.FloatTensor(sinusoid_table).unsqueeze(0)


class AuthorsTokenAttention(nn.Module):
    def __init__(self, dim, num_heads=8, in_dim=None, qkv_bias=False, qk_scale=None):
        super().__init__()
        self.num_heads = num_heads
        self.in_dim = in_dim
        head_dim = dim // num_heads
        self.scale = qk_scale or head_dim**-0.5
        self.qkv = nn.Linear(dim, in_dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(in_dim, in_dim)

    def forward(self, x):
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.in_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, self.in_dim)
        x = self.proj(x)
        return v.squeeze(1) + x


class AuthorsTokenTransformer(nn.Module):
    def __init__(self, dim, in_dim, num_heads, mlp_ratio=1.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = AuthorsTokenAttention(dim, in_dim=in_dim, num_heads=num_heads)
        self.norm2 = nn.LayerNorm(in_dim)
        self.mlp = AuthorsMlp(in_features=in_dim, hidden_features=int(in_dim * mlp_ratio), out_features=in_dim)

    def forward(self, x):
        x = self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class AuthorsTokenPerformer(nn.Module):
    def __init__(self, dim, in_dim, head_cnt=1, kernel_ratio=0.5, dp1=0.1, dp2=0.1):
        super().__init__()
        self.emb = in_dim * head_cnt
        self.kqv = nn.Linear(dim, 3 * self.emb)
        self.dp = nn.Dropout(dp1)
        self.proj = nn.Linear(self.emb, self.emb)
        self.head_cnt = head_cnt
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(self.emb)
        self.epsilon = 1e-8
        self.mlp = nn.Sequential(
            nn.Linear(self.emb, 1 * self.emb), nn.GELU(), nn.Linear(1 * self.emb, self.emb), nn.Dropout(dp2)
        )
        self.m = int(self.emb * kernel_ratio)
        self.w = torch.randn(self.m, self.emb)
        self.w = nn.Parameter(nn.init.orthogonal_(self.w) * math.sqrt(self.m), requires_grad=False)

    def prm_exp(self, x):
        xd = ((x * x).sum(dim=-1, keepdim=True)).repeat(1, 1, self.m) / 2
        wtx = torch.einsum("bti,mi->btm", x.float(), self.w)
        return torch.exp(wtx - xd) / math.sqrt(self.m)

    def single_attn(self, x):
        k, q, v = torch.split(self.kqv(x), self.emb, dim=-1)
        kp, qp = self.prm_exp(k), self.prm_exp(q)
        D = torch.einsum("bti,bi->bt", qp, kp.sum(dim=1)).unsqueeze(dim=2)
        kptv = torch.einsum("bin,bim->bnm", v.float(), kp)
        y = torch.einsum("bti,bni->btn", qp, kptv) / (D.repeat(1, 1, self.emb) + self.epsilon)
        return v + self.dp(self.proj(y))

    def forward(self, x):
        x = self.single_attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class AuthorsT2TModule(nn.Module):
    def __init__(self, img_size=224, tokens_type="performer", in_chans=3, embed_dim=768, token_dim=64):
        super().__init__()
        self.soft_split0 = nn.Unfold(kernel_size=(7, 7), stride=(4, 4), padding=(2, 2))
        self.soft_split1 = nn.Unfold(kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))
        self.soft_split2 = nn.Unfold(kernel_size=(3, 3), stride=(2, 2), padding=(1, 1))
        if tokens_type == "transformer":
            self.attention1 = AuthorsTokenTransformer(dim=in_chans * 7 * 7, in_dim=token_dim, num_heads=1)
            self.attention2 = AuthorsTokenTransformer(dim=token_dim * 3 * 3, in_dim=token_dim, num_heads=1)
        else:
            self.attention1 = AuthorsTokenPerformer(dim=in_chans * 7 * 7, in_dim=token_dim, kernel_ratio=0.5)
            self.attention2 = AuthorsTokenPerformer(dim=token_dim * 3 * 3, in_dim=token_dim, kernel_ratio=0.5)
        self.project = nn.Linear(token_dim * 3 * 3, embed_dim)
        self.num_patches = (img_size // (4 * 2 * 2)) * (img_size // (4 * 2 * 2))

    def forward(self, x):
        x = self.soft_split0(x).transpose(1, 2)
        x = self.attention1(x)
        B, new_HW, C = x.shape
        x = x.transpose(1, 2).reshape(B, C, int(np.sqrt(new_HW)), int(np.sqrt(new_HW)))
        x = self.soft_split1(x).transpose(1, 2)
        x = self.attention2(x)
        B, new_HW, C = x.shape
        x = x.transpose(1, 2).reshape(B, C, int(np.sqrt(new_HW)), int(np.sqrt(new_HW)))
        x = self.soft_split2(x).transpose(1, 2)
        return self.project(x)


class AuthorsT2TViT(nn.Module):
    def __init__(
        self,
        img_size=224,
        tokens_type="performer",
        in_chans=3,
        num_classes=1000,
        embed_dim=768,
        depth=12,
        num_heads=12,
        mlp_ratio=4.0,
        qkv_bias=False,
        qk_scale=None,
        token_dim=64,
    ):
        super().__init__()
        self.tokens_to_token = AuthorsT2TModule(img_size, tokens_type, in_chans, embed_dim, token_dim)
        num_patches = self.tokens_to_token.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(get_sinusoid_encoding(num_patches + 1, embed_dim), requires_grad=False)
        self.blocks = nn.ModuleList(
            [AuthorsBlock(embed_dim, num_heads, mlp_ratio, qkv_bias, qk_scale) for _ in range(depth)]
        )
        self.norm = nn.LayerNorm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes)

    def forward(self, x):
        B = x.shape[0]
        x = self.tokens_to_token(x)
        x = torch.cat((self.cls_token.expand(B, -1, -1), x), dim=1)
        x = x + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


# --- fixtures ---------------------------------------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("one_thread")


def _authors(tokens_type: str, seed: int, **kw) -> AuthorsT2TViT:
    """The authors' model with spread-out random weights (std 0.02 would give nearly uniform attention)."""
    torch.manual_seed(seed)
    spec = {**dict(img_size=SIZE, num_classes=3, **TINY), **kw}
    model = AuthorsT2TViT(tokens_type=tokens_type, **spec).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".w") or name == "pos_embed":
                continue  # fixed tables: the performer's random features and the sinusoid
            scale = (0.08 if "kqv" in name else 0.3) if name.endswith("weight") and p.dim() == 2 else 0.1
            p.copy_(torch.randn_like(p) * scale + (1.0 if "norm" in name and name.endswith("weight") else 0.0))
    return model


def _tiny_converter(name: str, tokens_type: str, **kw) -> Converter:
    cfg = {**TINY, **kw}
    return Converter(
        name=name,
        config=lambda num_labels: t2t.T2TViTConfig(
            tokens_type=tokens_type, image_size=SIZE, num_labels=num_labels, **cfg
        ),
        model_class=t2t.T2TViTForImageClassification,
        classifier_key="head.weight",
        image_size=(SIZE, SIZE),
    )


def _save_official(model: nn.Module, path: Path) -> Path:
    """As the authors' training script saves it: ``state_dict_ema`` (and more), keys with ``module.``."""
    sd = {f"module.{k}": v for k, v in model.state_dict().items()}
    torch.save({"epoch": 7, "state_dict": sd, "state_dict_ema": sd, "arch": "t2t_vit"}, path)
    return path


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, tuple[AuthorsT2TViT, Path]]:
    """Both kinds of tokens-to-token layer: the authors' model and the folder ``vitviz convert`` wrote."""
    root = tmp_path_factory.mktemp("t2t")
    out = {}
    for i, tt in enumerate(("performer", "transformer")):
        model = _authors(tt, seed=i)
        ckpt = _save_official(model, root / f"{tt}.pth.tar")
        name = f"t2t_test_{tt}"
        t2t.CONVERTERS[name] = _tiny_converter(name, tt)
        try:
            rc = main(["convert", "--arch", name, "--checkpoint", str(ckpt), "--out", str(root / tt)])
        finally:
            del t2t.CONVERTERS[name]
        assert rc == 0
        out[tt] = (model, root / tt)
    return out


@pytest.fixture(scope="module")
def loaded(converted):
    return {tt: load_model(str(folder), device="cpu") for tt, (_, folder) in converted.items()}


KINDS = ("performer", "transformer")


# --- 1. the model and the converter ----------------------------------------------------------------------


@pytest.mark.parametrize("tt", KINDS)
def test_converted_folder_gives_the_authors_logits(converted, loaded, tt):
    model, _ = converted[tt]
    pixels = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(pixels)
        got = loaded[tt].model(pixel_values=pixels).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    ours = loaded[tt].model.state_dict()
    assert set(ours) == set(model.state_dict())  # the authors' keys are the model's own
    assert torch.equal(ours["pos_embed"], model.pos_embed)  # taken from the file, not recomputed
    assert loaded[tt].config.model_type == "t2t" and family_for(loaded[tt].config).name == "T2T-ViT"


def test_the_smallest_released_size_converts_with_its_official_name(tmp_path):
    """T2T-ViT-7 as the authors build it at 224 px: its official name converts it; logits are the authors'."""
    torch.manual_seed(0)
    model = AuthorsT2TViT(tokens_type="performer", embed_dim=256, depth=7, num_heads=4, mlp_ratio=2.0).eval()
    ckpt = _save_official(model, tmp_path / "71.7_T2T_ViT_7.pth.tar")
    assert main(["convert", "--arch", "t2t_vit_7", "--checkpoint", str(ckpt), "--out", str(tmp_path / "o")]) == 0
    got = load_model(str(tmp_path / "o"), device="cpu")
    assert got.default_size == (224, 224) and got.image_mean == pytest.approx((0.485, 0.456, 0.406))
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(got.model(pixel_values=pixels).logits, model(pixels), rtol=1e-4, atol=1e-5)


# README: #params 4.3M, 5.9M, 6.9M, 21.5M, 39.2M, 64.1M; T2T-ViT_t-14/19/24 21.5M, 39.2M, 64.1M; 14 at 384: 21.7M.
RELEASED = {
    "t2t_vit_7": 4.3,
    "t2t_vit_10": 5.9,
    "t2t_vit_12": 6.9,
    "t2t_vit_14": 21.5,
    "t2t_vit_19": 39.2,
    "t2t_vit_24": 64.1,
    "t2t_vit_t_14": 21.5,
    "t2t_vit_t_19": 39.2,
    "t2t_vit_t_24": 64.1,
    "t2t_vit_14_384": 21.7,
}


def test_official_names_have_the_released_sizes():
    assert set(RELEASED) <= set(official_names())
    for name, millions in RELEASED.items():
        conv = t2t.CONVERTERS[name]
        with torch.device("meta"):  # shapes only
            model = conv.model_class(conv.config(num_labels=1000))
        assert round(sum(p.numel() for p in model.parameters()) / 1e6, 1) == millions, name
        side = 384 if name.endswith("_384") else 224
        assert conv.image_size == (side, side) and model.config.image_size == side
        assert model.config.tokens_type == ("transformer" if "_t_" in name else "performer")
        assert model.pos_embed.shape[1] == (side // 16) ** 2 + 1


def test_sinusoid_table_is_the_authors(converted):
    torch.testing.assert_close(t2t.sinusoid_table(10, 16), get_sinusoid_encoding(10, 16), rtol=0, atol=0)


def test_backbone_scale_is_a_config_field():
    """None: head_dim ** -0.5 (the authors' main.py); their ``pretrained=True`` constructors pass embed_dim ** -0.5."""
    model = _authors("performer", seed=5, qk_scale=TINY["embed_dim"] ** -0.5)
    sd = model.state_dict()
    ours = {}
    for scale in (None, TINY["embed_dim"] ** -0.5):
        cfg = t2t.T2TViTConfig(tokens_type="performer", image_size=SIZE, num_labels=3, qk_scale=scale, **TINY)
        m = t2t.T2TViTForImageClassification(cfg).eval()
        m.load_state_dict(sd)
        assert m.blocks[0].attn.scale == (scale or (TINY["embed_dim"] // TINY["num_heads"]) ** -0.5)
        ours[scale] = m
    pixels = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(pixels)
        torch.testing.assert_close(ours[TINY["embed_dim"] ** -0.5](pixel_values=pixels).logits, want)
        assert not torch.allclose(ours[None](pixel_values=pixels).logits, want)


def test_token_transformer_scale_is_the_input_width():
    m = t2t.T2TViTForImageClassification(t2t.T2TViTConfig(tokens_type="transformer", num_labels=2))
    assert m.tokens_to_token.attention1.attn.scale == 147**-0.5
    assert m.tokens_to_token.attention2.attn.scale == 576**-0.5
    assert m.norm.eps == 1e-5 and m.tokens_to_token.attention1.norm1.eps == 1e-5


@pytest.mark.parametrize(("h", "w", "match"), [(48, 40, "square inputs only"), (64, 64, "configured input size 48")])
def test_other_inputs_are_refused_with_a_message(loaded, h, w, match):
    with pytest.raises(ValueError, match=match):
        loaded["performer"].model(pixel_values=torch.zeros(1, 3, h, w))
    fam = loaded["performer"].family
    assert fam.size_problem(loaded["performer"].config, (h, w)) and not fam.size_problem(
        loaded["performer"].config, (48, 48)
    )
    assert input_size_for(loaded["performer"], (h, w)) == (48, 48)  # vitviz resizes every image to it


# --- 2. bad checkpoints: a message, nothing written ---------------------------------------------------------


def _convert_tiny(tmp_path, sd, tt="performer", **kw) -> tuple[int, Path]:
    name = "t2t_test_bad"
    t2t.CONVERTERS[name] = _tiny_converter(name, tt, **kw)
    path = tmp_path / "ckpt.pth"
    torch.save({"state_dict_ema": sd}, path)
    out = tmp_path / "out"
    try:
        return main(["convert", "--arch", name, "--checkpoint", str(path), "--out", str(out)]), out
    finally:
        del t2t.CONVERTERS[name]


def test_a_checkpoint_of_another_size_names_the_shapes(tmp_path, capsys):
    sd = _authors("performer", seed=1).state_dict()
    rc, out = _convert_tiny(tmp_path, sd, embed_dim=24, num_heads=2)
    err = capsys.readouterr().err
    assert rc == 1 and "of another shape" in err and "cls_token: (1, 1, 16) in the file, (1, 1, 24)" in err
    assert not out.exists() and not list(tmp_path.glob(".out-*"))


def test_missing_and_unexpected_keys_are_named(tmp_path, capsys):
    sd = dict(_authors("performer", seed=1).state_dict())
    del sd["tokens_to_token.attention2.w"]
    sd["aux_head.weight"] = torch.zeros(3, 16)
    rc, out = _convert_tiny(tmp_path, sd)
    err = capsys.readouterr().err
    assert rc == 1 and "1 keys missing: tokens_to_token.attention2.w" in err
    assert "1 keys unexpected: aux_head.weight" in err and not out.exists()


def test_a_transformer_checkpoint_does_not_fit_a_performer_name(tmp_path, capsys):
    rc, out = _convert_tiny(tmp_path, _authors("transformer", seed=1).state_dict(), tt="performer")
    err = capsys.readouterr().err
    assert rc == 1 and "tokens_to_token.attention1.kqv.weight" in err and not out.exists()


def test_a_pickled_model_object_is_refused(tmp_path, capsys):
    path = tmp_path / "model.pth"
    torch.save(_authors("performer", seed=1), path)  # the module itself, not its state dict
    out = tmp_path / "out"
    assert main(["convert", "--arch", "t2t_vit_7", "--checkpoint", str(path), "--out", str(out)]) == 1
    assert "not a plain state dict" in capsys.readouterr().err and not out.exists()


def test_list_names_the_released_models(capsys):
    assert main(["convert", "--list"]) == 0
    assert set(RELEASED) <= set(capsys.readouterr().out.split())
    with pytest.raises(ConvertError, match=r"Known official names: .*t2t_vit_t_14"):
        from vitviz.zoo.convert import converter_for

        converter_for("t2t_vit_99")


# --- 3. capture: every map against a recomputation from the module's own projections -------------------------


def _observe(model: nn.Module, pixels: torch.Tensor) -> list[dict]:
    """Each block's recomputed attention (B, H, T, T), from test-local hooks on its projections."""
    seen: list[dict] = []
    hooks = []
    t2tm = model.tokens_to_token

    def token_layer(layer):
        def hook(mod, args, out):
            x = layer.norm1(args[0])  # the layer's own normalised input
            if hasattr(layer, "w"):  # performer: k, q, v order; features with the stored w
                k, q, v = layer.kqv(x).split(layer.emb, dim=-1)

                def phi(z):
                    return torch.exp(z @ layer.w.T - (z * z).sum(-1, keepdim=True) / 2) / math.sqrt(layer.w.shape[0])

                qp, kp = phi(q), phi(k)
                a = (qp @ kp.transpose(1, 2)) / ((qp @ kp.sum(1, keepdim=True).transpose(1, 2)) + 1e-8)
                # The implied attention reproduces the layer: v + proj(A v), then the MLP.
                y = v + layer.proj(a @ v)
                torch.testing.assert_close(y + layer.mlp(layer.norm2(y)), out, rtol=1e-5, atol=1e-5)
            else:  # token transformer: one head, scale = input width ** -0.5, applied to q
                q, k, v = layer.attn.qkv(x).chunk(3, dim=-1)
                a = ((q * x.shape[-1] ** -0.5) @ k.transpose(1, 2)).softmax(-1)
            seen.append({"attn": a[:, None].detach(), "grid": None})

        return hook

    def block(blk):
        def hook(mod, args, out):
            x = blk.norm1(args[0])
            b, n, c = x.shape
            h = blk.attn.num_heads
            q, k, _ = blk.attn.qkv(x).reshape(b, n, 3, h, c // h).permute(2, 0, 3, 1, 4)
            seen.append({"attn": ((q @ k.transpose(-2, -1)) * (c // h) ** -0.5).softmax(-1).detach()})

        return hook

    for layer in (t2tm.attention1, t2tm.attention2):
        hooks.append(layer.register_forward_hook(token_layer(layer)))
    for blk in model.blocks:
        hooks.append(blk.register_forward_hook(block(blk)))
    try:
        with torch.no_grad():
            model(pixel_values=pixels)
    finally:
        for hk in hooks:
            hk.remove()
    return seen


@pytest.mark.parametrize("tt", KINDS)
def test_stages_grids_and_prefix(loaded, tt):
    cap = capture(loaded[tt], random_image(1), attention_dtype="float32")
    assert cap.input_size == (48, 48) and cap.patch_size == 4 and cap.readout == "cls"
    assert [s.grid for s in cap.stages] == [(12, 12), (6, 6), (3, 3)]
    assert [s.prefix_kinds for s in cap.stages] == [(), (), ("CLS",)]
    assert [s.blocks for s in cap.stages] == [(0,), (1,), (2, 3)]
    assert [b.num_heads for b in cap.blocks] == [1, 1, 2, 2] and cap.rollout_note == ""
    assert [b.attention.shape for b in cap.blocks] == [(1, 144, 144), (1, 36, 36), (2, 10, 10), (2, 10, 10)]
    # token norms: the stage's input (row 0) and each block's output
    assert cap.stages[0].token_norms.shape == (2, 144) and cap.stages[2].token_norms.shape == (3, 10)


@pytest.mark.parametrize("tt", KINDS)
def test_every_captured_attention_equals_the_recomputation(loaded, tt):
    images = [random_image(7, size=(60, 44)), random_image(8, size=(30, 70))]
    caps = capture_batch(loaded[tt], images, attention_dtype="float32")
    pixels, _ = preprocess(loaded[tt], images, (SIZE, SIZE))
    seen = _observe(loaded[tt].model, pixels)
    assert len(seen) == len(caps[0].blocks) == 4
    for i, cap in enumerate(caps):
        for b, s in zip(cap.blocks, seen, strict=True):
            np.testing.assert_allclose(b.attention, s["attn"][i].numpy(), rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(b.fused, s["attn"][i].mean(0).numpy(), rtol=1e-4, atol=1e-6)
            # rows sum to 1; a performer's to D / (D + 1e-8), D = phi(q) . sum phi(k) (its epsilon)
            np.testing.assert_allclose(
                b.attention.sum(-1), 1.0, atol=1e-3 if b.stage < 2 and tt == "performer" else 1e-5
            )
    # the maps are far from uniform (a wrong scale or key order would show)
    assert caps[0].blocks[0].attention.max() > 5 / 144


def test_implied_attention_applied_to_v_is_the_performers_output(loaded):
    layer = loaded["performer"].model.tokens_to_token.attention1
    x = layer.norm1(torch.randn(2, 20, layer.kqv.in_features, generator=torch.Generator().manual_seed(0)))
    k, q, v = layer.kqv(x).split(layer.emb, dim=-1)
    a = implied_attention(layer.prm_exp(q), layer.prm_exp(k))
    with torch.no_grad():
        torch.testing.assert_close(v + layer.proj(a[:, 0] @ v), layer.single_attn(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tt", KINDS)
def test_distance_and_entropy_per_block(loaded, tt):
    """Pixel distances between cell centres of each stage's own grid (4, 8, 16 px cells at 48 px)."""
    img = random_image(40, size=(48, 48))
    cap = capture(loaded[tt], img, attention_dtype="float32")
    pixels, _ = preprocess(loaded[tt], [img], (SIZE, SIZE))
    seen = _observe(loaded[tt].model, pixels)
    for b, s in zip(cap.blocks, seen, strict=True):
        grid = cap.stages[b.stage].grid
        p = 1 if b.stage == 2 else 0
        c = centres(grid, cap.input_size)
        for h in range(b.num_heads):
            a = s["attn"][0, h].double().numpy()
            ent = float(np.mean([-sum(x * math.log(x) for x in row if x > 0) for row in a]))
            assert b.distance[h] == pytest.approx(mean_distance_reference(a[p:, p:], c, c), rel=1e-4)
            assert b.entropy[h] == pytest.approx(ent, rel=1e-4)


# --- 4. rollout, relevance, readout ---------------------------------------------------------------------------


def _merges() -> dict[int, np.ndarray]:
    """Centre rule: old token (r, c) merges into new cell (r // 2, c // 2); CLS enters the backbone with a zero row."""

    def parent(r, c):
        return r // 2, c // 2

    return {1: merge_matrix((12, 12), (6, 6), parent), 2: merge_matrix((6, 6), (3, 3), parent, prefix=1)}


@pytest.mark.parametrize("tt", KINDS)
def test_rollout_equals_dense_reference(loaded, tt):
    img = random_image(20, size=(50, 50))
    cap = capture(loaded[tt], img, attention_dtype="float32")
    pixels, _ = preprocess(loaded[tt], [img], (SIZE, SIZE))
    seen = _observe(loaded[tt].model, pixels)
    dense = [s["attn"][0].mean(0).double().numpy() for s in seen]
    merges = _merges()
    assert np.all(merges[2][0] == 0)  # CLS carries no image content until it attends
    readout = np.eye(10)[0]  # CLS of the backbone
    ref = rollout_reference(dense, [0, 1, 2, 2], merges, readout)
    row, stage = capture_rollout(cap)
    assert stage == 0 and row.shape == (144,)
    np.testing.assert_allclose(row, ref, rtol=1e-4, atol=1e-7)
    assert row.sum() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("tt", KINDS)
def test_readout_head_reproduces_the_logits(loaded, tt):
    model = loaded[tt].model
    fam = loaded[tt].family
    pixels = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(4))
    last = {}
    hk = model.blocks[-1].register_forward_hook(lambda m, a, o: last.setdefault("x", o))
    try:
        with torch.no_grad():
            logits = model(pixel_values=pixels).logits
            torch.testing.assert_close(fam.readout_head(model)(last["x"]), logits)
    finally:
        hk.remove()


@pytest.mark.parametrize("tt", KINDS)
def test_relevance_equals_reference_with_own_gradients(loaded, tt):
    """Chefer et al. through the stages; a performer's implied attention is off the autograd path (zero gradient),
    so its T2T stages add nothing: the reference gives them Abar = 0."""
    img = random_image(30, size=(40, 52))
    ex = explain_classes(loaded[tt], img, [0, 2])
    model = loaded[tt].model
    pixels, _ = preprocess(loaded[tt], [img], (SIZE, SIZE))
    kept: list[torch.Tensor] = []
    drops = [blk.attn.attn_drop for blk in model.blocks]
    if tt == "transformer":
        t2tm = model.tokens_to_token
        drops = [t2tm.attention1.attn.attn_drop, t2tm.attention2.attn.attn_drop, *drops]
    hooks = [d.register_forward_hook(lambda m, a, o: kept.append(o)) for d in drops]
    try:
        with torch.enable_grad():
            pixels.requires_grad_(True)
            logits = model(pixel_values=pixels).logits
            for c in (0, 2):
                grads = torch.autograd.grad(logits[0, c], kept, retain_graph=True)
                abar = [
                    (g * a).clamp(min=0).mean(1)[0].detach().double().numpy() for g, a in zip(grads, kept, strict=True)
                ]
                if tt == "performer":
                    abar = [np.zeros((144, 144)), np.zeros((36, 36)), *abar]
                ref = relevance_reference(abar, [0, 1, 2, 2], _merges(), np.eye(10)[0])
                assert ex[c].grid == (12, 12) and ex[c].readout == "CLS"
                np.testing.assert_allclose(ex[c].relevance, ref, rtol=1e-4, atol=1e-7)
    finally:
        for hk in hooks:
            hk.remove()
    assert not np.allclose(ex[0].relevance, ex[2].relevance)


def test_position_table_and_budget(loaded):
    info = loaded["performer"].position
    assert info.tables[0].grid == (3, 3)
    np.testing.assert_array_equal(info.tables[0].embeddings, loaded["performer"].model.pos_embed[0, 1:].numpy())
    fam, cfg = loaded["performer"].family, loaded["performer"].config
    assert fam.attention_numel(cfg, (48, 48)) == 144**2 + 36**2 + 2 * 2 * 10**2
    assert loaded["performer"].patch_weights is None
    from vitviz.capture.forward import check_budget

    with pytest.raises(BudgetError, match="square input of 48 x 48"):
        check_budget(loaded["performer"], (48, 40), batch=1, gradients=False, budget=2**30)


def test_registration_is_idempotent():
    t2t._register()
    t2t._register()
    from transformers import AutoConfig

    assert type(AutoConfig.for_model("t2t")) is t2t.T2TViTConfig


def test_bfloat16_runs_and_stays_close(converted):
    """The performer's features are float32 (as the authors'); the model's dtype comes back before ``proj``."""
    folder = converted["performer"][1]
    low, full = load_model(str(folder), device="cpu", dtype="bfloat16"), load_model(str(folder), device="cpu")
    a, b = capture(low, random_image(2)), capture(full, random_image(2))
    np.testing.assert_allclose(a.logits, b.logits, atol=0.05)
    np.testing.assert_allclose(a.blocks[0].attention.astype(np.float32), b.blocks[0].attention, atol=0.01)
