"""Tiny checkpoints in the layout of the ViT paper's JAX code, and that code's forward written out in numpy.

``tiny_arrays`` draws the parameter tree of ``vit_jax/models_vit.py`` (and ``models_resnet.py``
for hybrids) flattened with '/' as ``vit_jax/checkpoint.py`` saves it, with the pre-linen
module numbering the published files carry (``MultiHeadDotProductAttention_1``, ``LayerNorm_2``,
``MlpBlock_3``). ``jax_forward`` is a transcription of those modules' ``__call__`` in float64
numpy, with flax's conventions: NHWC images, HWIO kernels, ``(in, out)`` dense kernels,
``DenseGeneral`` attention kernels ``(D, H, d)`` / ``(H, d, D)``, LayerNorm epsilon 1e-6, group
norm with 32 groups and epsilon 1e-6, ``nn.gelu`` (tanh approximation), TF "SAME" padding
(``pad_before = total // 2``), StdConv's ``(w - mean) / (std + 1e-5)``, and the position grid
resized as ``checkpoint.interpolate_posembed`` does (``scipy.ndimage.zoom``, order 1). Nothing here
imports vitviz: the converter is checked against it, not against itself.

This transcription was checked once against the authors' own flax modules (``vit_jax/models_vit.py``
and ``models_resnet.py`` at c6de1e5, jax 0.11.2, on a machine that has flax): ``model.init`` gives
exactly the parameter names and shapes ``tiny_arrays`` draws (plain, pre_logits, ResNet (1, 2),
(1, 1, 2) with pre_logits, the root alone with 2 x 2 patches), and ``model.apply`` on these arrays
agrees with ``jax_forward`` to 2e-5 (flax computing in float32) and with the converted vitviz model to
7e-4 (both float32, peaked attention); flax is not installed where the tests run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

PRE_LINEN = ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
LINEN = ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")


def tiny_arrays(
    *,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    mlp: int = 48,
    patch: int = 8,
    grid: int = 4,
    resnet: tuple[int, ...] | None = None,
    width: int = 32,
    representation: int | None = None,
    classes: int | None = 5,
    names: tuple[str, str, str, str] = PRE_LINEN,
) -> dict[str, np.ndarray]:
    """A random float32 checkpoint. ``resnet``: units per stage (None: a plain ViT, ``patch`` on pixels; else
    ``patch`` on the ResNet's map). Query/key kernels are drawn wide, so attention is far from uniform."""
    rng = np.random.default_rng(seed)

    def r(*shape, std=0.2):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    a: dict[str, np.ndarray] = {}
    c_in = 3
    if resnet is not None:
        a["conv_root/kernel"] = r(7, 7, 3, width)
        a["gn_root/scale"], a["gn_root/bias"] = 1 + r(width), r(width)
        c_in = width
        for s, depth in enumerate(resnet):
            mid, out = width * 2**s, 4 * width * 2**s
            for u in range(depth):
                p = f"block{s + 1}/unit{u + 1}/"
                ins = c_in if u == 0 else out
                for j, (k, i, o) in enumerate(((1, ins, mid), (3, mid, mid), (1, mid, out)), 1):
                    a[f"{p}conv{j}/kernel"] = r(k, k, i, o)
                    a[f"{p}gn{j}/scale"], a[f"{p}gn{j}/bias"] = 1 + r(o), r(o)
                if u == 0:
                    a[f"{p}conv_proj/kernel"] = r(1, 1, ins, out)
                    a[f"{p}gn_proj/scale"], a[f"{p}gn_proj/bias"] = 1 + r(out), r(out)
            c_in = out
    d, hd = hidden, hidden // heads
    a["embedding/kernel"] = r(patch, patch, c_in, d, std=1 / math.sqrt(patch * patch * c_in))
    a["embedding/bias"] = r(d)
    a["cls"] = r(1, 1, d)
    a["Transformer/posembed_input/pos_embedding"] = r(1, 1 + grid * grid, d, std=0.5)
    ln1, att, ln2, mlpb = names
    for i in range(layers):
        p = f"Transformer/encoderblock_{i}/"
        for ln in (ln1, ln2):
            a[f"{p}{ln}/scale"], a[f"{p}{ln}/bias"] = 1 + r(d), r(d)
        for qkv in ("query", "key", "value"):
            a[f"{p}{att}/{qkv}/kernel"] = r(d, heads, hd, std=(1.0 if qkv != "value" else 0.3))
            a[f"{p}{att}/{qkv}/bias"] = r(heads, hd)
        a[f"{p}{att}/out/kernel"] = r(heads, hd, d)
        a[f"{p}{att}/out/bias"] = r(d)
        a[f"{p}{mlpb}/Dense_0/kernel"], a[f"{p}{mlpb}/Dense_0/bias"] = r(d, mlp), r(mlp)
        a[f"{p}{mlpb}/Dense_1/kernel"], a[f"{p}{mlpb}/Dense_1/bias"] = r(mlp, d), r(d)
    a["Transformer/encoder_norm/scale"], a["Transformer/encoder_norm/bias"] = 1 + r(d), r(d)
    width_out = d
    if representation is not None:
        a["pre_logits/kernel"], a["pre_logits/bias"] = r(d, representation), r(representation)
        width_out = representation
    if classes is not None:
        a["head/kernel"], a["head/bias"] = r(width_out, classes, std=1.0), r(classes)
    return a


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    """As ``vit_jax`` saves: ``np.savez`` of the flattened tree (keys joined by '/')."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


# --- the JAX code's forward, in numpy ---------------------------------------------------------------------


def _same_pads(n: int, k: int, s: int) -> tuple[int, int]:
    total = max((math.ceil(n / s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


def _conv(x: np.ndarray, kernel: np.ndarray, stride: int, padding: str = "SAME") -> np.ndarray:
    """flax ``nn.Conv``: x ``(N, H, W, C)``, kernel ``(kh, kw, C, O)``."""
    kh, kw = kernel.shape[:2]
    if padding == "SAME":
        x = np.pad(x, ((0, 0), _same_pads(x.shape[1], kh, stride), _same_pads(x.shape[2], kw, stride), (0, 0)))
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))[:, ::stride, ::stride]
    return np.einsum("nijcab,abco->nijo", win, kernel)


def _max_pool_same(x: np.ndarray, k: int = 3, s: int = 2) -> np.ndarray:
    """flax ``nn.max_pool(padding='SAME')``: padding with -inf."""
    x = np.pad(x, ((0, 0), _same_pads(x.shape[1], k, s), _same_pads(x.shape[2], k, s), (0, 0)), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(1, 2))[:, ::s, ::s]
    return win.max(axis=(-2, -1))


def _std_conv(kernel: np.ndarray) -> np.ndarray:
    """``models_resnet.weight_standardize(w, axis=[0, 1, 2], eps=1e-5)``."""
    w = kernel - kernel.mean(axis=(0, 1, 2))
    return w / (w.std(axis=(0, 1, 2)) + 1e-5)


def _group_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, groups: int = 32) -> np.ndarray:
    n, h, w, c = x.shape
    g = x.reshape(n, h, w, groups, c // groups)
    mean = g.mean(axis=(1, 2, 4), keepdims=True)
    var = (g**2).mean(axis=(1, 2, 4), keepdims=True) - mean**2
    return ((g - mean) / np.sqrt(var + 1e-6)).reshape(n, h, w, c) * scale.reshape(-1) + bias.reshape(-1)


def _layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-6) * scale + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    """``flax.linen.gelu`` = ``jax.nn.gelu(approximate=True)``."""
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def resnet_forward(a: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The hybrid's root and stages (``VisionTransformer.__call__``'s ResNet part): ``(N, H, W, 3) -> (N, h, w, C)``."""
    x = _conv(x, _std_conv(a["conv_root/kernel"]), 2)
    x = _relu(_group_norm(x, a["gn_root/scale"], a["gn_root/bias"]))
    x = _max_pool_same(x)
    s = 1
    while f"block{s}/unit1/conv1/kernel" in a:
        u = 1
        while f"block{s}/unit{u}/conv1/kernel" in a:
            p = f"block{s}/unit{u}/"
            stride = 2 if (s > 1 and u == 1) else 1
            features = a[f"{p}conv3/kernel"].shape[-1]
            residual = x
            if x.shape[-1] != features or stride != 1:  # ResidualUnit's needs_projection
                residual = _conv(x, _std_conv(a[f"{p}conv_proj/kernel"]), stride)
                residual = _group_norm(residual, a[f"{p}gn_proj/scale"], a[f"{p}gn_proj/bias"])
            y = _relu(_group_norm(_conv(x, _std_conv(a[f"{p}conv1/kernel"]), 1), a[f"{p}gn1/scale"], a[f"{p}gn1/bias"]))
            y = _relu(
                _group_norm(_conv(y, _std_conv(a[f"{p}conv2/kernel"]), stride), a[f"{p}gn2/scale"], a[f"{p}gn2/bias"])
            )
            y = _group_norm(_conv(y, _std_conv(a[f"{p}conv3/kernel"]), 1), a[f"{p}gn3/scale"], a[f"{p}gn3/bias"])
            x = _relu(residual + y)
            u += 1
        s += 1
    return x


def interpolate_posembed(posemb: np.ndarray, new: tuple[int, int]) -> np.ndarray:
    """``checkpoint.interpolate_posembed`` (CLS kept, the grid zoomed with ``scipy.ndimage.zoom(order=1)``), for a
    ``new`` grid of any shape."""
    import scipy.ndimage

    tok, grid = posemb[:, :1], posemb[0, 1:]
    old = math.isqrt(len(grid))
    if (old, old) == tuple(new):
        return posemb
    grid = grid.reshape(old, old, -1)
    grid = scipy.ndimage.zoom(grid, (new[0] / old, new[1] / old, 1), order=1)
    return np.concatenate([tok, grid.reshape(1, new[0] * new[1], -1)], axis=1)


def jax_forward(
    arrays: dict[str, np.ndarray],
    pixels_nchw: np.ndarray,
    *,
    names: tuple[str, str, str, str] = PRE_LINEN,
    feature_map: bool = False,
):
    """Logits ``(N, C)`` (or the pooled ``(N, D)`` without a head) of the JAX model for normalised pixels (NCHW in,
    transposed to flax's NHWC here). ``feature_map``: also return the ResNet's map ``(N, h, w, C)``."""
    a = {k: np.asarray(v, np.float64) for k, v in arrays.items()}
    x = np.asarray(pixels_nchw, np.float64).transpose(0, 2, 3, 1)
    fmap = None
    if "conv_root/kernel" in a:
        x = fmap = resnet_forward(a, x)
    p = a["embedding/kernel"].shape[0]
    x = _conv(x, a["embedding/kernel"], p, padding="VALID") + a["embedding/bias"]
    n, h, w, c = x.shape
    x = x.reshape(n, h * w, c)
    x = np.concatenate([np.tile(a["cls"], (n, 1, 1)), x], axis=1)
    x = x + interpolate_posembed(a["Transformer/posembed_input/pos_embedding"], (h, w))
    ln1, att, ln2, mlpb = names
    i = 0
    while f"Transformer/encoderblock_{i}/{ln1}/scale" in a:
        p_ = f"Transformer/encoderblock_{i}/"
        y = _layer_norm(x, a[f"{p_}{ln1}/scale"], a[f"{p_}{ln1}/bias"])
        q, k, v = (
            np.einsum("btd,dhk->bthk", y, a[f"{p_}{att}/{n_}/kernel"]) + a[f"{p_}{att}/{n_}/bias"]
            for n_ in ("query", "key", "value")
        )
        logits = np.einsum("bqhk,bthk->bhqt", q, k) / math.sqrt(q.shape[-1])
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        o = np.einsum("bhqt,bthk->bqhk", probs, v)
        x = x + np.einsum("bqhk,hkd->bqd", o, a[f"{p_}{att}/out/kernel"]) + a[f"{p_}{att}/out/bias"]
        y = _layer_norm(x, a[f"{p_}{ln2}/scale"], a[f"{p_}{ln2}/bias"])
        y = _gelu(y @ a[f"{p_}{mlpb}/Dense_0/kernel"] + a[f"{p_}{mlpb}/Dense_0/bias"])
        x = x + y @ a[f"{p_}{mlpb}/Dense_1/kernel"] + a[f"{p_}{mlpb}/Dense_1/bias"]
        i += 1
    x = _layer_norm(x, a["Transformer/encoder_norm/scale"], a["Transformer/encoder_norm/bias"])[:, 0]
    if "pre_logits/kernel" in a:
        x = np.tanh(x @ a["pre_logits/kernel"] + a["pre_logits/bias"])
    if "head/kernel" in a:
        x = x @ a["head/kernel"] + a["head/bias"]
    return (x, fmap) if feature_map else x
