"""CCT (vitviz.zoo.cct and its family adapter) on tiny random-weight models, checked against the authors' code.

``_Official*`` below is a transcription of SHI-Labs/Compact-Transformers (``src/cct.py``,
``src/utils/tokenizer.py``, ``src/utils/transformers.py``, ``src/utils/helpers.py``:
``resize_pos_embed``), kept with its names and its order of operations, dropout included (as
the identity at evaluation). Attention parity is recomputed from each block's own ``qkv``
weights and the pooling's own ``attention_pool`` (test-local forward hooks), and gradients come
from this file's own hooks and ``torch.autograd.grad``. Query/key and pooling weights are redrawn
with a large spread: the default initialisation gives nearly uniform attention, under which a
wrong key order or a wrong scale could still pass.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import random_image
from reference import relevance_reference, rollout_reference
from torch import nn

from vitviz.__main__ import main
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture, capture_batch
from vitviz.capture.gradients import explain_classes
from vitviz.models.families import family_for
from vitviz.models.load import load_model
from vitviz.zoo.cct import CONVERTERS, CctConfig, CctForImageClassification, token_grid
from vitviz.zoo.convert import ConvertError, convert, official_names

pytestmark = pytest.mark.usefixtures("one_thread")

# --- the authors' code, transcribed ---------------------------------------------------------------------


class _OfficialTokenizer(nn.Module):
    def __init__(self, kernel_size, stride, padding, n_conv_layers, n_output_channels, in_planes=64):
        super().__init__()
        n_filter_list = [3] + [in_planes for _ in range(n_conv_layers - 1)] + [n_output_channels]
        self.conv_layers = nn.Sequential(
            *[
                nn.Sequential(
                    nn.Conv2d(
                        n_filter_list[i],
                        n_filter_list[i + 1],
                        kernel_size=(kernel_size, kernel_size),
                        stride=(stride, stride),
                        padding=(padding, padding),
                        bias=False,
                    ),
                    nn.ReLU(),
                    nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
                )
                for i in range(n_conv_layers)
            ]
        )
        self.flattener = nn.Flatten(2, 3)

    def sequence_length(self, height, width):
        return self.forward(torch.zeros((1, 3, height, width))).shape[1]

    def forward(self, x):
        return self.flattener(self.conv_layers(x)).transpose(-2, -1)


class _OfficialAttention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        self.attn_drop = nn.Dropout(0.1)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.1)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * self.scale
        attn = self.attn_drop(attn.softmax(dim=-1))
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


class _OfficialLayer(nn.Module):
    def __init__(self, d_model, nhead, dim_feedforward):
        super().__init__()
        self.pre_norm = nn.LayerNorm(d_model)
        self.self_attn = _OfficialAttention(d_model, nhead)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout1 = nn.Dropout(0.1)
        self.norm1 = nn.LayerNorm(d_model)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.dropout2 = nn.Dropout(0.1)

    def forward(self, src):
        src = src + self.self_attn(self.pre_norm(src))
        src = self.norm1(src)
        src2 = self.linear2(self.dropout1(F.gelu(self.linear1(src))))
        return src + self.dropout2(src2)


class _OfficialClassifier(nn.Module):
    def __init__(self, embedding_dim, num_layers, num_heads, mlp_ratio, num_classes, sequence_length):
        super().__init__()
        self.num_tokens = 0
        self.attention_pool = nn.Linear(embedding_dim, 1)
        self.positional_emb = nn.Parameter(torch.zeros(1, sequence_length, embedding_dim))
        nn.init.trunc_normal_(self.positional_emb, std=0.2)
        self.dropout = nn.Dropout(0.1)
        self.blocks = nn.ModuleList(
            [_OfficialLayer(embedding_dim, num_heads, int(embedding_dim * mlp_ratio)) for _ in range(num_layers)]
        )
        self.norm = nn.LayerNorm(embedding_dim)
        self.fc = nn.Linear(embedding_dim, num_classes)

    def forward(self, x):
        x += self.positional_emb
        x = self.dropout(x)
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        x = torch.matmul(F.softmax(self.attention_pool(x), dim=1).transpose(-1, -2), x).squeeze(-2)
        return self.fc(x)


class _OfficialCCT(nn.Module):
    """``_cct``: stride ``max(1, k // 2 - 1)``, padding ``max(1, k // 2)``; ``CCT`` with a learnable table."""

    def __init__(
        self, img_size, embedding_dim, n_conv_layers, kernel_size, num_layers, num_heads, mlp_ratio, num_classes
    ):
        super().__init__()
        stride, padding = max(1, (kernel_size // 2) - 1), max(1, (kernel_size // 2))
        self.tokenizer = _OfficialTokenizer(kernel_size, stride, padding, n_conv_layers, embedding_dim)
        self.classifier = _OfficialClassifier(
            embedding_dim,
            num_layers,
            num_heads,
            mlp_ratio,
            num_classes,
            self.tokenizer.sequence_length(img_size, img_size),
        )

    def forward(self, x):
        return self.classifier(self.tokenizer(x))


def _resize_pos_embed(posemb, posemb_new):
    """``helpers.resize_pos_embed`` with ``num_tokens=0`` (what ``pe_check`` does for CCT)."""
    posemb_grid = posemb[0]
    gs_old, gs_new = int(math.sqrt(len(posemb_grid))), int(math.sqrt(posemb_new.shape[1]))
    posemb_grid = posemb_grid.reshape(1, gs_old, gs_old, -1).permute(0, 3, 1, 2)
    posemb_grid = F.interpolate(posemb_grid, size=(gs_new, gs_new), mode="bilinear")
    return posemb_grid.permute(0, 2, 3, 1).reshape(1, gs_new * gs_new, -1)


# The authors' constructors (src/cct.py): cct_7 / cct_14 sizes, <k>x<conv layers>, image size, classes.
_CCT_7 = dict(num_layers=7, num_heads=4, mlp_ratio=2, embedding_dim=256)
_CCT_14 = dict(num_layers=14, num_heads=6, mlp_ratio=3, embedding_dim=384)
_OFFICIAL = {
    name: dict(**size, kernel_size=k, n_conv_layers=convs, img_size=img, num_classes=classes)
    for name, size, k, convs, img, classes in (
        ("cct_7_3x1_32", _CCT_7, 3, 1, 32, 10),
        ("cct_7_3x1_32_sine", _CCT_7, 3, 1, 32, 10),
        ("cct_7_3x1_32_c100", _CCT_7, 3, 1, 32, 100),
        ("cct_7_3x1_32_sine_c100", _CCT_7, 3, 1, 32, 100),
        ("cct_7_7x2_224_sine", _CCT_7, 7, 2, 224, 102),
        ("cct_14_7x2_224", _CCT_14, 7, 2, 224, 1000),
        ("cct_14_7x2_384", _CCT_14, 7, 2, 384, 1000),
        ("cct_14_7x2_384_fl", _CCT_14, 7, 2, 384, 102),
    )
}

TINY = dict(image_size=32, embedding_dim=32, num_layers=2, num_heads=4, mlp_ratio=2, n_conv_layers=2, kernel_size=3)
LABELS = {"id2label": {0: "zero", 1: "one", 2: "two"}, "label2id": {"zero": 0, "one": 1, "two": 2}}


def _spread(model: nn.Module, seed: int = 1) -> None:
    """Redraw query/key and pooling weights with a large spread (peaked, clearly non-uniform attention)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("qkv.weight", "attention_pool.weight")):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith(("attention_pool.bias", "norm.bias", "norm1.bias")):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def save_tiny_cct(folder: Path, *, seed: int = 0, **overrides) -> Path:
    """A tiny random-weight CCT (two conv layers: 64 channels between them) saved as vitviz loads it."""
    from transformers import ViTImageProcessor

    torch.manual_seed(seed)
    model = CctForImageClassification(CctConfig(**{**TINY, **overrides}, **LABELS)).eval()
    _spread(model, seed + 1)
    model.save_pretrained(folder, safe_serialization=True)
    side = model.config.image_size
    ViTImageProcessor(size={"height": side, "width": side}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(str(save_tiny_cct(tmp_path_factory.mktemp("cct") / "tiny")), device="cpu")


def _official(name: str, seed: int = 0) -> _OfficialCCT:
    torch.manual_seed(seed)
    model = _OfficialCCT(**_OFFICIAL[name]).eval()
    _spread(model, seed + 1)
    return model


# --- the model and its converters ---------------------------------------------------------------------------


def test_every_official_name_has_the_authors_keys_shapes_and_input(capsys):
    assert set(CONVERTERS) == set(_OFFICIAL) and set(_OFFICIAL) <= set(official_names())
    assert main(["convert", "--list"]) == 0 and set(_OFFICIAL) <= set(capsys.readouterr().out.split())
    for name, kw in _OFFICIAL.items():
        conv = CONVERTERS[name]
        with torch.device("meta"):  # shapes only: no memory, no initialisation cost
            ours = CctForImageClassification(conv.config(num_labels=kw["num_classes"])).state_dict()
            theirs = _OfficialCCT(**kw).state_dict()
        assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}, name
        assert conv.image_size == (kw["img_size"],) * 2
    assert CONVERTERS["cct_14_7x2_224"].mean == (0.485, 0.456, 0.406)
    assert CONVERTERS["cct_7_3x1_32_c100"].std == (0.2675, 0.2565, 0.2761)
    assert CONVERTERS["cct_14_7x2_384_fl"].mean == (0.4353, 0.3773, 0.2872)
    assert "positional_emb" in CONVERTERS["cct_7_7x2_224_sine"].notes
    assert "positional_emb" not in CONVERTERS["cct_14_7x2_224"].notes
    assert "cct_7_7x2_224" not in CONVERTERS  # the authors released no checkpoint for it


def test_token_grid_follows_the_convolutions():
    cfg = CONVERTERS["cct_14_7x2_224"].config()
    assert token_grid(cfg, (224, 224)) == (14, 14) and token_grid(cfg, (384, 384)) == (24, 24)
    assert token_grid(CONVERTERS["cct_7_3x1_32"].config(), (32, 32)) == (16, 16)
    assert family_for(cfg).patch_size(cfg) == 16


def test_registration_is_idempotent_and_auto_classes_build_the_model():
    from transformers import AutoConfig, AutoModelForImageClassification

    from vitviz.zoo import cct

    cct._register()  # a second registration is harmless
    cfg = AutoConfig.for_model("cct", **TINY)
    assert isinstance(AutoModelForImageClassification.from_config(cfg), CctForImageClassification)


@pytest.mark.parametrize("wrap", ["plain", "state_dict", "module"])
def test_convert_an_official_checkpoint_gives_the_authors_logits(tmp_path, wrap):
    official = _official("cct_7_3x1_32")
    sd = official.state_dict()
    if wrap == "state_dict":  # as the timm-based train.py's CheckpointSaver writes it (minus its argparse args)
        payload = {"epoch": 299, "arch": "cct_7_3x1_32", "state_dict": sd, "version": 2}
    elif wrap == "module":  # DataParallel training
        payload = {"state_dict": {f"module.{k}": v for k, v in sd.items()}}
    else:  # the released files: a plain state dict
        payload = sd
    ckpt = tmp_path / "cct.pth"
    torch.save(payload, ckpt)
    out = tmp_path / "out"
    assert main(["convert", "--arch", "cct_7_3x1_32", "--checkpoint", str(ckpt), "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"model.safetensors", "config.json", "preprocessor_config.json"}
    loaded = load_model(str(out), device="cpu")
    assert loaded.family.name == "CCT" and loaded.default_size == (32, 32)
    assert loaded.image_mean == pytest.approx((0.4914, 0.4822, 0.4465)) and len(loaded.id2label) == 10
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = official(x.clone())
        got = loaded.model(pixel_values=x).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_convert_a_two_layer_tokenizer_at_224(tmp_path):
    official = _official("cct_7_7x2_224_sine")
    ckpt = tmp_path / "flowers.pth"
    torch.save(official.state_dict(), ckpt)
    out = convert("cct_7_7x2_224_sine", ckpt, tmp_path / "out")
    model = load_model(str(out), device="cpu").model
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(pixel_values=x).logits, official(x.clone()), rtol=1e-5, atol=1e-5)
    # the checkpoint's table is kept (the authors' loader would swap in a freshly initialised one), and said so
    torch.testing.assert_close(model.classifier.positional_emb, official.classifier.positional_emb)
    assert "position table is used as stored" in load_model(str(out), device="cpu").position.note


def test_another_input_size_resizes_the_table_as_the_authors_loader_does():
    official32 = _official("cct_7_3x1_32")
    ours = CctForImageClassification(CONVERTERS["cct_7_3x1_32"].config(num_labels=10)).eval()
    ours.load_state_dict(official32.state_dict())
    # the authors: a model built for 48 px, loaded through pe_check (bilinear resize of the 16 x 16 table)
    torch.manual_seed(0)
    official48 = _OfficialCCT(**{**_OFFICIAL["cct_7_3x1_32"], "img_size": 48}).eval()
    sd = official32.state_dict()
    sd["classifier.positional_emb"] = _resize_pos_embed(
        sd["classifier.positional_emb"], official48.classifier.positional_emb
    )
    official48.load_state_dict(sd)
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(ours(pixel_values=x).logits, official48(x.clone()), rtol=1e-5, atol=1e-5)


def _ckpt(tmp_path, sd) -> Path:
    path = tmp_path / "bad.pth"
    torch.save(sd, path)
    return path


def _nothing_written(tmp_path, out: Path) -> None:
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_a_checkpoint_of_another_size_names_the_shape(tmp_path, capsys):
    big = _OfficialCCT(**{**_OFFICIAL["cct_7_3x1_32"], "img_size": 64})  # a 32 x 32 position table
    out = tmp_path / "out"
    path = _ckpt(tmp_path, big.state_dict())
    assert main(["convert", "--arch", "cct_7_3x1_32", "--checkpoint", str(path), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "classifier.positional_emb: (1, 1024, 256) in the file, (1, 256, 256)" in err and "another shape" in err
    _nothing_written(tmp_path, out)


def test_missing_and_unexpected_keys_are_named(tmp_path):
    sd = _OfficialCCT(**_OFFICIAL["cct_7_3x1_32"]).state_dict()
    del sd["classifier.attention_pool.weight"]
    sd["classifier.class_emb"] = torch.zeros(1, 1, 256)  # the seq_pool=False variant's CLS
    out = tmp_path / "out"
    with pytest.raises(ConvertError) as err:
        convert("cct_7_3x1_32", _ckpt(tmp_path, sd), out)
    assert "1 keys missing: classifier.attention_pool.weight" in str(err.value)
    assert "1 keys unexpected: classifier.class_emb" in str(err.value)
    _nothing_written(tmp_path, out)


def test_a_pickled_module_is_refused(tmp_path, capsys):
    path = _ckpt(tmp_path, _OfficialCCT(**_OFFICIAL["cct_7_3x1_32"]))  # the model object, not its state dict
    out = tmp_path / "out"
    assert main(["convert", "--arch", "cct_7_3x1_32", "--checkpoint", str(path), "--out", str(out)]) == 1
    assert "not a plain state dict" in capsys.readouterr().err
    _nothing_written(tmp_path, out)


# --- capture: parity with the module's own projections ----------------------------------------------------------


def _reference_run(model: nn.Module, pixels: torch.Tensor):
    """Each block's probabilities from its own ``qkv`` weights, and the pooling weights from ``attention_pool``.

    Hooks on ``pre_norm`` (the attention input) and ``classifier.norm`` (the pooled tokens), independent of vitviz.
    """
    probs, pool = [], []

    def attention(block):
        def hook(module, args, output):
            b, n, c = output.shape
            h = block.self_attn.num_heads
            qkv = (output @ block.self_attn.qkv.weight.T).reshape(b, n, 3, h, c // h)
            q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
            probs.append(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(c // h), dim=-1))

        return hook

    def pooling(module, args, output):
        lin = model.classifier.attention_pool
        pool.append(torch.softmax(output @ lin.weight.T + lin.bias, dim=1)[..., 0])

    handles = [b.pre_norm.register_forward_hook(attention(b)) for b in model.classifier.blocks]
    handles.append(model.classifier.norm.register_forward_hook(pooling))
    try:
        with torch.no_grad():
            out = model(pixel_values=pixels)
    finally:
        for h in handles:
            h.remove()
    return out, probs, pool[0]


def test_every_captured_attention_is_what_the_blocks_computed(tiny):
    img = random_image(3)
    cap = capture(tiny, img, attention_dtype="float32")
    assert cap.readout == "head" and cap.prefix_kinds == () and cap.grid == (8, 8)
    assert [b.kind for b in cap.blocks] == ["global", "global", "pool"]
    assert cap.attentions.shape == (2, 4, 64, 64) and cap.blocks[-1].attention.shape == (1, 64)
    from vitviz.capture.forward import preprocess

    pixels, _ = preprocess(tiny, [img], (32, 32))
    out, probs, pool = _reference_run(tiny.model, pixels)
    for i, p in enumerate(probs):
        np.testing.assert_allclose(cap.blocks[i].attention, p[0].numpy(), atol=1e-6)
        assert p[0].max() > 0.5  # peaked: a wrong key order would not pass
    np.testing.assert_allclose(cap.blocks[-1].attention[0], pool[0].numpy(), atol=1e-6)
    np.testing.assert_allclose(cap.logits, out.logits[0].numpy(), atol=1e-5)
    # the pooled vector is the weights' combination of the normed tokens, as the model computes it
    assert cap.blocks[-1].attention.sum() == pytest.approx(1.0, abs=1e-5)


def test_capture_batch_at_another_size(tiny):
    """Two images in one forward at 48 px (the 8 x 8 table resized to 12 x 12): every map is what the blocks did."""
    from vitviz.capture.forward import preprocess

    imgs = [random_image(4), random_image(5, (30, 50))]
    caps = capture_batch(tiny, imgs, size=48, attention_dtype="float32")
    pixels, _ = preprocess(tiny, imgs, (48, 48))
    out, probs, pool = _reference_run(tiny.model, pixels)
    for j, cap in enumerate(caps):
        assert cap.input_size == (48, 48) and cap.grid == (12, 12)
        for i, p in enumerate(probs):
            np.testing.assert_allclose(cap.blocks[i].attention, p[j].numpy(), atol=1e-6)
        np.testing.assert_allclose(cap.blocks[-1].attention[0], pool[j].numpy(), atol=1e-6)
        np.testing.assert_allclose(cap.logits, out.logits[j].numpy(), atol=1e-5)


def test_positions_and_filters(tiny):
    info = tiny.position
    assert info.tables[0].grid == (8, 8) and info.tables[0].embeddings.shape == (64, 32)
    np.testing.assert_array_equal(info.tables[0].embeddings, tiny.model.classifier.positional_emb[0].numpy())
    assert tiny.patch_weights.shape == (64, 3, 3, 3)  # 64 channels between the two conv layers
    assert tiny.patch_size == 4


# --- rollout and relevance read out the sequence pooling ------------------------------------------------------


def test_rollout_starts_from_the_pooling_weights(tiny):
    cap = capture(tiny, random_image(6), attention_dtype="float32")
    row, stage = capture_rollout(cap)
    dense = [cap.blocks[i].attention.astype(np.float64).mean(axis=0) for i in range(2)]
    w = cap.blocks[-1].attention[0].astype(np.float64)
    want = rollout_reference(dense, [0, 0], {}, w)
    np.testing.assert_allclose(row, want, rtol=1e-5, atol=1e-7)
    assert stage == 0 and row.sum() == pytest.approx(1.0)
    # not the mean of the rows: the pooling weights are far from uniform here
    uniform = rollout_reference(dense, [0, 0], {}, np.full(64, 1 / 64))
    assert np.abs(row - uniform).max() > 1e-3


def test_relevance_pairs_each_gradient_with_its_block(tiny):
    """Gradients of the logit with respect to the very tensors the blocks and the pooling multiplied with."""
    from vitviz.capture.forward import preprocess

    img, c = random_image(7), 1
    pixels, _ = preprocess(tiny, [img], (32, 32))
    _, probs, pool = _reference_run(tiny.model, pixels)
    kept = {}

    def keep(module, args, output) -> None:  # returns None: the forward goes on with its own output
        kept["w"] = output[1]

    handle = tiny.model.classifier.pooling.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            out = tiny.model(pixel_values=pixels.clone().requires_grad_(True), output_attentions=True)
    finally:
        handle.remove()
    tensors = [*out.attentions, kept["w"]]
    for got, want in zip(tensors, [*probs, pool[..., None]], strict=True):  # they are the recomputed probabilities
        torch.testing.assert_close(got.detach(), want, atol=1e-6, rtol=1e-5)
    grads = torch.autograd.grad(out.logits[0, c], tensors)
    abar = [
        (g * a).clamp(min=0).mean(dim=1)[0].detach().double().numpy()
        for g, a in zip(grads[:-1], tensors[:-1], strict=True)
    ]
    readout = (grads[-1] * tensors[-1]).clamp(min=0)[0, :, 0].detach().double().numpy()
    want = relevance_reference(abar, [0, 0], {}, readout)
    got = explain_classes(tiny, img, [c])[c]
    assert got.readout == "pooling head"
    np.testing.assert_allclose(got.relevance, want, rtol=1e-4, atol=1e-7)
    assert np.abs(want).max() > 0


def test_head_knock_outs_edit_the_blocks_projection_inputs(tiny):
    """Head importance (zero mode) against knock-outs made here with a pre-hook on the block's ``proj``."""
    from vitviz.capture.forward import preprocess
    from vitviz.causal import causal_notes, head_importance, knockable_blocks

    img = random_image(8)
    got = head_importance(tiny, img, target=2, mode="zero")
    assert got.effects.shape == (3, 4) and np.isnan(got.effects[2]).all()  # the pooling has no heads to knock out
    notes = causal_notes(tiny)
    assert notes["lens"]  # no affine readout head: no lens
    assert not notes["knockout"] and "2 of 3" in notes["knockout_partial"]  # the pages offer the two blocks
    assert knockable_blocks(tiny) == (0, 1)
    pixels, _ = preprocess(tiny, [img], (32, 32))
    with torch.no_grad():
        clean = tiny.model(pixel_values=pixels).logits[0, 2]
    d = 32 // 4
    for block, head in ((0, 1), (1, 3)):

        def zero(module, args, head=head):
            z = args[0].clone()
            z[..., head * d : (head + 1) * d] = 0
            return (z,)

        handle = tiny.model.classifier.blocks[block].self_attn.proj.register_forward_pre_hook(zero)
        try:
            with torch.no_grad():
                knocked = tiny.model(pixel_values=pixels).logits[0, 2]
        finally:
            handle.remove()
        assert got.effects[block, head] == pytest.approx(float(knocked - clean), abs=1e-5)
