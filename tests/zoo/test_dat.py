"""DAT (vitviz.zoo.dat): the authors' state-dict layout, conversion, and every captured block against a recomputation.

The reference never uses vitviz's window or spreading code, nor ``grid_sample``: for
every block it takes the block's normalised input and the block's own weights,
computes q and k at every position of the stage map in the original frame, and

* for a window block (``L``, ``S``) allows each query the keys of its (shifted) window,
  adds the relative bias at the offset inside the window and, when shifted, -100
  between the roll's regions, and takes the softmax;
* for a deformable block (``D``) runs the offset network, places each group's sample
  points at ``reference + tanh(o) * factor / Hk``, reads the input there by explicit
  bilinear interpolation (``align_corners=True``, zero outside), projects keys, adds
  the ``rpe_table`` bias read the same way at ``(query - point) / 2``, takes the
  softmax over the samples, and spreads each sample's weight onto the 4 cells around it.

The authors' code itself (81c67ea) needs timm and einops, which are not here; it was run
once beside this model with the same random state dicts (dat_tiny at 224, dat_base_384 at
384, also with offsets large enough to leave the map): logits and sampled positions were
equal to the bit. The key names and shapes below are the ones its ``state_dict()`` has.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from conftest import random_image
from reference import merge_matrix, rollout_reference

from vitviz.__main__ import main
from vitviz.analysis.blocks import dense
from vitviz.analysis.rollout import capture_rollout
from vitviz.capture.forward import capture, capture_batch, input_size_for, preprocess
from vitviz.models.load import load_model
from vitviz.zoo import dat as zoo_dat
from vitviz.zoo.convert import Converter, ConvertError, convert, official_names
from vitviz.zoo.dat import CONVERTERS, DatConfig, DatForImageClassification, size_problem

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(
    image_size=32,
    patch_size=2,
    dim_stem=8,
    dims=[8, 16, 32, 64],
    depths=[2, 2, 2, 2],
    heads=[1, 2, 2, 4],
    window_sizes=[4, 4, 2, 2],
    groups=[-1, -1, 1, 2],
    stage_spec=[["L", "S"], ["L", "S"], ["L", "D"], ["L", "D"]],
    offset_kernel_sizes=[3, 3, 3, 3],
    id2label={i: f"class {i}" for i in range(5)},
    label2id={f"class {i}": i for i in range(5)},
)


def tiny_model(seed: int = 0, **changes) -> DatForImageClassification:
    """A tiny DAT with weights large enough that attention is far from uniform and sampled points leave the map."""
    torch.manual_seed(seed)
    model = DatForImageClassification(DatConfig(**{**TINY, **changes})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "conv_offset.3" in name:
                p.normal_(0, 3.0)  # tanh saturates: offsets up to factor / Hk, beyond the map's edge
            elif "table" in name:
                p.normal_(0, 1.0)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
            elif p.dim() > 1:
                p.normal_(0, (2.0 / p[0].numel()) ** 0.5)
            else:
                p.normal_(1.0, 0.1)
    return model


def save_tiny_dat(folder, seed: int = 0):
    from transformers import ViTImageProcessor

    tiny_model(seed).save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model(str(save_tiny_dat(tmp_path_factory.mktemp("dat") / "tiny")))


# --- the authors' layout and the converter -------------------------------------------------------------------


def _meta_state(name: str) -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        return DatForImageClassification(CONVERTERS[name].config()).state_dict()


@pytest.mark.parametrize(
    ("name", "count", "shapes"),
    [
        (
            "dat_tiny",
            219,
            {
                "stages.0.attns.1.attn_mask": (64, 49, 49),
                "stages.1.attns.1.attn_mask": (16, 49, 49),
                "stages.0.attns.0.relative_position_index": (49, 49),
                "stages.0.attns.0.relative_position_bias_table": (169, 3),
                "stages.2.attns.1.rpe_table": (12, 27, 27),
                "stages.2.attns.1.conv_offset.0.weight": (128, 1, 5, 5),
                "stages.2.attns.1.conv_offset.1.norm.weight": (128,),
                "stages.2.attns.1.conv_offset.3.weight": (2, 128, 1, 1),
                "stages.3.attns.1.rpe_table": (24, 13, 13),
                "stages.3.attns.1.conv_offset.0.weight": (128, 1, 3, 3),
                "stages.2.mlps.0.chunk.linear1.weight": (1536, 384),
                "patch_proj.0.weight": (96, 3, 4, 4),
                "down_projs.0.0.weight": (192, 96, 2, 2),
                "cls_head.weight": (1000, 768),
            },
        ),
        (
            "dat_base_384",
            435,
            {
                "stages.0.attns.1.attn_mask": (64, 144, 144),
                "stages.2.attns.1.rpe_table": (16, 47, 47),
                "stages.2.attns.1.conv_offset.0.weight": (128, 1, 5, 5),
                "stages.3.attns.1.rpe_table": (32, 23, 23),
                "stages.3.attns.1.conv_offset.0.weight": (128, 1, 3, 3),
            },
        ),
    ],
)
def test_state_dict_keys_and_shapes_are_the_authors(name, count, shapes):
    state = _meta_state(name)
    assert len(state) == count
    for key, shape in shapes.items():
        assert tuple(state[key].shape) == shape, key
    assert not any("drop" in k or "block_ends" in k for k in state)  # hook markers and dropouts hold no keys


def test_the_official_names_are_listed():
    assert {"dat_tiny", "dat_small", "dat_base", "dat_base_384"} <= set(official_names())
    assert CONVERTERS["dat_base_384"].image_size == (384, 384) and CONVERTERS["dat_tiny"].image_size == (224, 224)
    cfg = CONVERTERS["dat_small"].config()
    assert cfg.depths == [2, 2, 18, 2] and cfg.stage_spec[2] == ["L", "D"] * 9 and cfg.stage_spec[0] == ["L", "S"]


@pytest.fixture
def tiny_converter(monkeypatch):
    """``dat_test``: the converter path with the tiny configuration (the official sizes are too big for a test)."""
    conv = Converter(
        name="dat_test",
        config=lambda num_labels=1000: DatConfig(**{**TINY, "id2label": None, "label2id": None}, num_labels=num_labels),
        model_class=DatForImageClassification,
        classifier_key="cls_head.weight",
        image_size=(32, 32),
    )
    monkeypatch.setitem(zoo_dat.CONVERTERS, "dat_test", conv)
    return conv


def test_convert_round_trip_gives_the_same_logits(tmp_path, tiny_converter):
    source = tiny_model(3)
    path = tmp_path / "dat_test.pth"
    # As the authors' main.py saves it: the model's state dict under "model", beside training state.
    torch.save({"model": source.state_dict(), "epoch": 299, "max_accuracy": 82.0}, path)
    out = tmp_path / "converted"
    assert main(["convert", "--arch", "dat_test", "--checkpoint", str(path), "--out", str(out)]) == 0
    loaded = load_model(str(out))
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(pixel_values=x).logits, source(x).logits, rtol=0, atol=0)
    assert loaded.family.name == "DAT" and loaded.model.config.num_labels == 5


def test_a_checkpoint_of_another_size_is_refused_with_the_key(tmp_path, tiny_converter):
    path = tmp_path / "wide.pth"
    torch.save({"model": tiny_model(0, dim_stem=16, dims=[16, 32, 64, 128]).state_dict()}, path)
    out = tmp_path / "out"
    with pytest.raises(ConvertError, match=r"of another shape: patch_proj\.0\.weight: \(16, 3, 2, 2\)"):
        convert("dat_test", path, out)
    assert not out.exists()


def test_missing_and_extra_keys_are_named(tmp_path, tiny_converter):
    sd = tiny_model(0).state_dict()
    del sd["stages.2.attns.1.rpe_table"]
    sd["stages.2.attns.1.q_grid"] = torch.zeros(1)
    path = tmp_path / "odd.pth"
    torch.save({"model": sd}, path)
    out = tmp_path / "out"
    with pytest.raises(ConvertError, match=r"missing: stages\.2\.attns\.1\.rpe_table.*unexpected: stages\.2\.attns"):
        convert("dat_test", path, out)
    assert not out.exists()


def test_a_pickled_module_is_refused_and_nothing_is_written(tmp_path, tiny_converter):
    path = tmp_path / "model.pth"
    torch.save(tiny_model(0), path)  # a whole nn.Module: weights_only refuses it, no code runs
    out = tmp_path / "out"
    with pytest.raises(ConvertError, match="not a plain state dict"):
        convert("dat_test", path, out)
    assert main(["convert", "--arch", "dat_test", "--checkpoint", str(path), "--out", str(out)]) == 1
    assert not out.exists()


def test_sizes_the_model_cannot_run_are_refused():
    cfg = CONVERTERS["dat_tiny"].config()
    assert size_problem(cfg, (224, 224)) == ""
    assert "multiple of its window" in size_problem(cfg, (256, 256))
    assert "only size it runs at" in size_problem(cfg, (448, 448))
    assert "multiple of its window" in size_problem(CONVERTERS["dat_base_384"].config(), (224, 224))
    model = tiny_model(0)
    with pytest.raises(ValueError, match="multiple of its window"):
        model(torch.zeros(1, 3, 48, 48))


# --- the reference: every block recomputed in the original frame ---------------------------------------------


def _inputs(model: DatForImageClassification, pixels: torch.Tensor) -> list[torch.Tensor]:
    """Each attention block's (normalised) input, in forward order."""
    kept, handles = [], []
    for stage in model.stages:
        for attn in stage.attns:
            handles.append(attn.register_forward_pre_hook(lambda m, a: kept.append(a[0].detach().double())))
    try:
        with torch.no_grad():
            model(pixel_values=pixels)
    finally:
        for h in handles:
            h.remove()
    return kept


def _window_reference(attn, x: torch.Tensor, shift: int) -> np.ndarray:
    """``(heads, N, N)`` dense probabilities of a window block in the original frame (x: ``(C, H, W)``)."""
    c, n_h, n_w = x.shape
    w, heads = attn.window_size[0], attn.heads
    tokens = x.reshape(c, -1).T  # (N, C), row-major
    wt, bt = attn.proj_qkv.weight.double(), attn.proj_qkv.bias.double()
    q, k = (tokens @ wt[i * c : (i + 1) * c].T + bt[i * c : (i + 1) * c] for i in (0, 1))
    q = q * (c // heads) ** -0.5
    table = attn.relative_position_bias_table.detach().double()

    def frame(r, col):  # shifted-frame coordinates, window, offset inside it and roll region
        a, b = (r - shift) % n_h, (col - shift) % n_w
        region = tuple(0 if v < n - w else (1 if v < n - shift else 2) for v, n in ((a, n_h), (b, n_w)))
        return (a // w, b // w), (a % w, b % w), region

    pos = [(r, col) for r in range(n_h) for col in range(n_w)]
    info = [frame(r, col) for r, col in pos]
    out = np.zeros((heads, len(pos), len(pos)))
    d = c // heads
    for h in range(heads):
        logits = q[:, h * d : (h + 1) * d] @ k[:, h * d : (h + 1) * d].T
        for i, (win_i, off_i, reg_i) in enumerate(info):
            keys = [j for j, (win_j, _, _) in enumerate(info) if win_j == win_i]
            vals = []
            for j in keys:
                off_j, reg_j = info[j][1], info[j][2]
                idx = (off_i[0] - off_j[0] + w - 1) * (2 * w - 1) + (off_i[1] - off_j[1] + w - 1)
                mask = -100.0 if shift and reg_i != reg_j else 0.0
                vals.append(float(logits[i, j]) + float(table[idx, h]) + mask)
            p = torch.tensor(vals, dtype=torch.float64).softmax(0).numpy()
            out[h, i, keys] = p
    return out


def _corners(y: float, x: float, n_h: int, n_w: int) -> list[tuple[int, int, float]]:
    """Bilinear corners (row, col, weight) of normalised point (y, x) with align_corners=True, inside only."""
    py, px = (y + 1) / 2 * (n_h - 1), (x + 1) / 2 * (n_w - 1)
    y0, x0 = math.floor(py), math.floor(px)
    fy, fx = py - y0, px - x0
    out = []
    for r, wy in ((y0, 1 - fy), (y0 + 1, fy)):
        for col, wx in ((x0, 1 - fx), (x0 + 1, fx)):
            if 0 <= r < n_h and 0 <= col < n_w:
                out.append((r, col, wy * wx))
    return out


def _deformable_reference(attn, x: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(dense (heads, N, N), native (heads, N, Ns), points (groups, Ns, 2) y, x)`` of a deformable block."""
    c, n_h, n_w = x.shape
    heads, groups = attn.n_heads, attn.n_groups
    hg, gc, d = heads // groups, c // groups, c // heads

    def conv1x1(conv, t):  # t: (C, ...) -> (C', ...)
        flat = t.reshape(t.shape[0], -1)
        return (conv.weight.double()[:, :, 0, 0] @ flat + conv.bias.double()[:, None]).reshape(-1, *t.shape[1:])

    q = conv1x1(attn.proj_q, x)  # (C, H, W)
    offset_net = copy.deepcopy(attn.conv_offset).double()  # a copy: the shared model stays float32
    points = []
    for g in range(groups):
        with torch.no_grad():
            o = offset_net(q[g * gc : (g + 1) * gc][None])[0]  # (2, Hk, Wk): y, x
        hk, wk = o.shape[1:]
        pts = []
        for i in range(hk):
            for j in range(wk):
                ry, rx = (i + 0.5) / hk * 2 - 1, (j + 0.5) / wk * 2 - 1
                f = attn.offset_range_factor
                pts.append((ry + math.tanh(o[0, i, j]) * f / hk, rx + math.tanh(o[1, i, j]) * f / wk))
        points.append(pts)
    ns = len(points[0])
    sampled = torch.zeros(c, ns, dtype=torch.float64)
    for g in range(groups):
        for n, (y, xx) in enumerate(points[g]):
            for r, col, wt in _corners(y, xx, n_h, n_w):
                sampled[g * gc : (g + 1) * gc, n] += wt * x[g * gc : (g + 1) * gc, r, col]
    k = conv1x1(attn.proj_k, sampled)  # (C, Ns)
    table = attn.rpe_table.detach().double()
    native = np.zeros((heads, n_h * n_w, ns))
    spread = np.zeros((heads, n_h * n_w, n_h * n_w))
    for h in range(heads):
        g = h // hg
        logits = (q[h * d : (h + 1) * d].reshape(d, -1).T @ k[h * d : (h + 1) * d]) * d**-0.5  # (N, Ns)
        for m in range(n_h * n_w):
            qy, qx = (m // n_w + 0.5) / n_h * 2 - 1, (m % n_w + 0.5) / n_w * 2 - 1
            row = logits[m].clone()
            for n, (y, xx) in enumerate(points[g]):
                dy, dx = (qy - y) * 0.5, (qx - xx) * 0.5
                row[n] += sum(wt * table[h, r, col] for r, col, wt in _corners(dy, dx, 2 * n_h - 1, 2 * n_w - 1))
            p = row.softmax(0).numpy()
            native[h, m] = p
            for n, (y, xx) in enumerate(points[g]):
                for r, col, wt in _corners(y, xx, n_h, n_w):
                    spread[h, m, r * n_w + col] += p[n] * wt
    return spread, native, np.asarray(points)


def _reference(loaded, img) -> list[dict]:
    hw = input_size_for(loaded)
    pixels, _ = preprocess(loaded, [img], hw)
    xs = _inputs(loaded.model, pixels)
    refs, b = [], 0
    for s, stage in enumerate(loaded.model.stages):
        for attn, kind in zip(stage.attns, loaded.config.stage_spec[s], strict=True):
            x = xs[b][0]
            if kind == "D":
                spread, native, pts = _deformable_reference(attn, x)
                refs.append({"kind": kind, "dense": spread, "native": native, "points": pts, "grid": x.shape[1:]})
            else:
                shift = attn.shift_size if kind == "S" else 0
                refs.append({"kind": kind, "dense": _window_reference(attn, x, shift), "grid": x.shape[1:]})
            b += 1
    return refs


@pytest.fixture(scope="module")
def reference(loaded):
    img = random_image(5)
    return img, _reference(loaded, img)


def _captured_dense(block) -> np.ndarray:
    att = block.attention.astype(np.float64)
    if block.kind == "global":
        return att
    return np.stack([dense(block.geometry, att[:, h]) for h in range(block.num_heads)])


def test_every_block_equals_the_recomputation(loaded, reference):
    img, refs = reference
    cap = capture(loaded, img, attention_dtype="float32")
    assert [b.kind for b in cap.blocks] == ["window"] * 5 + ["global", "window", "global"]
    assert [s.grid for s in cap.stages] == [(16, 16), (8, 8), (4, 4), (2, 2)]
    assert [b.geometry.shift for b in cap.blocks[:4]] == [0, 2, 0, 2]  # ceil(4 / 2), the authors' shift
    for block, ref in zip(cap.blocks, refs, strict=True):
        assert block.geometry.grid == tuple(ref["grid"])
        np.testing.assert_allclose(_captured_dense(block), ref["dense"], atol=2e-6)
        if ref["kind"] != "D":
            np.testing.assert_allclose(block.attention.sum(-1), 1.0, atol=1e-5)


def test_deformable_rows_lose_exactly_the_mass_sampled_outside(loaded, reference):
    img, refs = reference
    cap = capture(loaded, img, attention_dtype="float32")
    outside_seen = False
    for block, ref in zip(cap.blocks, refs, strict=True):
        if ref["kind"] != "D":
            continue
        pts = ref["points"]  # (G, Ns, 2) y, x
        n_h, n_w = ref["grid"]
        inside = np.array([[sum(w for _, _, w in _corners(y, x, n_h, n_w)) for y, x in g] for g in pts])
        hg = block.num_heads // pts.shape[0]
        expected = np.stack([ref["native"][h] @ inside[h // hg] for h in range(block.num_heads)])  # (H, N)
        np.testing.assert_allclose(block.attention.sum(-1), expected, atol=2e-6)
        outside_seen |= bool((inside < 1 - 1e-6).any())
    assert outside_seen  # the tiny model's offsets do leave the map


def test_sampled_positions_are_the_model_output(loaded, reference):
    img, refs = reference
    pixels, _ = preprocess(loaded, [img], input_size_for(loaded))
    with torch.no_grad():
        out = loaded.model(pixel_values=pixels, output_sampling=True)
    got = [p for stage in out.positions for p in stage]
    for pos, ref in zip(got, refs, strict=True):
        if ref["kind"] != "D":
            assert pos is None
            continue
        g = ref["points"].shape[0]
        np.testing.assert_allclose(pos[0].reshape(g, -1, 2).numpy(), ref["points"], atol=1e-5)  # float32 model


def test_rollout_equals_the_dense_definition(loaded, reference):
    img, refs = reference
    cap = capture(loaded, img, attention_dtype="float32")
    fused = [r["dense"].mean(0) for r in refs]
    stage_of = [b.stage for b in cap.blocks]
    grids = [s.grid for s in cap.stages]
    merges = {s: merge_matrix(grids[s - 1], grids[s], lambda r, c: (r // 2, c // 2)) for s in (1, 2, 3)}
    expected = rollout_reference(fused, stage_of, merges, np.full(4, 1 / 4))
    got, stage = capture_rollout(cap)
    assert stage == 0 and got.shape == (256,)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-8)
    assert got.sum() == pytest.approx(1.0, abs=1e-5)


def test_batch_capture_equals_single_captures(loaded):
    imgs = [random_image(7), random_image(8, size=(30, 60))]
    batch = capture_batch(loaded, imgs, attention_dtype="float32")
    for img, cap in zip(imgs, batch, strict=True):
        one = capture(loaded, img, attention_dtype="float32")
        for a, b in zip(cap.blocks, one.blocks, strict=True):
            np.testing.assert_allclose(a.attention, b.attention, atol=1e-5)  # batched kernels round differently
        np.testing.assert_allclose(cap.logits, one.logits, atol=1e-5)


def test_readout_head_gives_the_logits(loaded):
    img = random_image(9)
    pixels, _ = preprocess(loaded, [img], input_size_for(loaded))
    last = []
    handle = loaded.model.stages[3].block_ends[1].register_forward_hook(lambda m, a, o: last.append(o))
    try:
        with torch.no_grad():
            logits = loaded.model(pixel_values=pixels).logits
    finally:
        handle.remove()
    readout = loaded.family.readout_head(loaded.model)
    with torch.no_grad():
        got = readout(last[0].flatten(2).transpose(1, 2))
    torch.testing.assert_close(got, logits, rtol=1e-5, atol=1e-5)
    cap = capture(loaded, img)
    assert cap.readout == "pooled" and cap.input_size == (32, 32) and cap.stages[0].token_norms.shape == (3, 256)
    assert loaded.has_classifier and cap.logits.shape == (5,) and cap.predictions[0].label.startswith("class")
