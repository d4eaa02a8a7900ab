"""``python -m vitviz convert --arch vit-npz --checkpoint FILE.npz --out DIR``: the ViT paper's own JAX checkpoints.

The ``.npz`` files published with google-research/vision_transformer (ViT-{Ti,S,B,L}/{16,32},
ViT-B/8, ViT-H/14, R50+ViT-B/16, R26+ViT-S/32, R50+ViT-L/32, R+ViT-Ti/16, and the AugReg
ones of "How to train your ViT") hold the flax parameter tree flattened with '/'
(``vit_jax/checkpoint.py``), in the layout of ``vit_jax/models_vit.py`` and
``models_resnet.py`` (timm's ``_load_weights`` reads the same names):

* ``embedding/{kernel,bias}`` (kernel ``(p, p, C_in, D)``, HWIO), ``cls`` ``(1, 1, D)``,
  ``Transformer/posembed_input/pos_embedding`` ``(1, 1 + N, D)``, ``Transformer/encoder_norm``;
* per block ``Transformer/encoderblock_{i}/``: ``LayerNorm_0``, ``MultiHeadDotProductAttention_1``
  (``query``/``key``/``value`` kernels ``(D, H, d)``, biases ``(H, d)``; ``out`` kernel ``(H, d, D)``),
  ``LayerNorm_2``, ``MlpBlock_3/Dense_{0,1}`` (kernels ``(in, out)``): the pre-linen names the files
  carry; linen's ``_0``/``_1``/``_0`` numbering is read too;
* optional ``pre_logits/{kernel,bias}`` (the representation layer of the ImageNet-21k checkpoints)
  and ``head/{kernel,bias}``;
* hybrids: ``conv_root/kernel``, ``gn_root/{scale,bias}``, ``block{s}/unit{u}/{conv1,conv2,conv3}/kernel``,
  ``gn{1,2,3}/{scale,bias}``, and on each stage's first unit ``conv_proj`` / ``gn_proj`` (group-norm
  parameters ``(C,)`` or, from older flax, ``(1, 1, 1, C)``).

Sizes are read from the arrays (width, depth, heads from the query kernel, MLP width, patch,
ResNet depths and width, the position grid, classes); a vit_jax model name (``--variant``, or
found in the file name: ``R50+ViT-B_16.npz``, ``R26_S_32-i21k-...npz``) is then checked against
them. The input size is the position grid's side times the total stride (384 for the 384-px
fine-tunes, whose tables the authors resized before fine-tuning).

Where the weights go:

* a plain ViT with a head and no representation layer -> ``transformers``' ``ViTForImageClassification``
  (tanh-approximate GELU, ``hidden_act="gelu_pytorch_tanh"``, and LayerNorm eps 1e-6, as flax; at an input
  size other than the checkpoint's, ``transformers`` resizes its position grid bicubically, where the paper's
  code resizes bilinearly with aligned corners: the logits at the checkpoint's own size are the paper's);
* a hybrid, or a ViT with ``pre_logits`` (which HF's ViT has no place for: dropping it would change
  every logit) -> vitviz's own :mod:`vitviz.zoo.hybrid` class, which keeps it; without a head -> its
  ``HybridViTModel``.

The processor written beside the weights normalises as the paper does (mean and std 0.5: pixels
to [-1, 1]) at the checkpoint's input size, bilinear resize.

Refused with a message, nothing written: a file that is not a zip of ``.npy`` arrays, object
arrays (pickles: the file is read with ``numpy.load(allow_pickle=False)``), arrays that are not
floating point, a file without the ViT arrays (a Mixer, a LiT, a big_vision checkpoint), a
``gap`` model (no CLS token), arrays missing, of another shape or that do not belong, NaN or
infinity, a model name whose sizes the arrays contradict (e.g. ResNet depths), and a head whose
classes differ from ``--num-classes`` or ``--labels``.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vitviz.zoo.convert import SHOWN, ConvertError, _check, check_archive

__all__ = ["ARCH", "NpzReport", "Variant", "VARIANTS", "Layout", "read_npz", "read_layout", "convert_vit_npz"]

ARCH = "vit-npz"
IMAGENET21K_CLASSES = 21843  # the label set of the ImageNet-21k pre-training checkpoints
_DATASET_CLASSES = {IMAGENET21K_CLASSES: "ImageNet-21k", 1000: "ImageNet-1k"}


# --- the vit_jax model names (vit_jax/configs/models.py) ---------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One vit_jax model: ResNet depths (None: no ResNet), the embedding's patch, and the transformer's sizes."""

    name: str
    resnet_depths: tuple[int, ...] | None
    patch_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int


_SIZES = {  # hidden size, layers, heads, MLP size
    "Ti": (192, 12, 3, 768),
    "S": (384, 12, 6, 1536),
    "B": (768, 12, 12, 3072),
    "L": (1024, 24, 16, 4096),
    "H": (1280, 32, 16, 5120),
}
_NAMED = {  # name: (ResNet depths, patch on the ResNet map or on pixels, size)
    "ViT-Ti_16": (None, 16, "Ti"),
    "ViT-S_16": (None, 16, "S"),
    "ViT-B_16": (None, 16, "B"),
    "ViT-L_16": (None, 16, "L"),
    "ViT-H_14": (None, 14, "H"),
    "ViT-B_8": (None, 8, "B"),
    "ViT-S_32": (None, 32, "S"),
    "ViT-B_32": (None, 32, "B"),
    "ViT-L_32": (None, 32, "L"),
    "R+ViT-Ti_16": ((), 8, "Ti"),
    "R50+ViT-B_16": ((3, 4, 9), 1, "B"),
    "R26+ViT-B_32": ((2, 2, 2, 2), 1, "B"),
    "R26+ViT-S_32": ((2, 2, 2, 2), 1, "S"),
    "R50+ViT-L_32": ((3, 4, 6, 3), 1, "L"),
}


def _variants() -> dict[str, Variant]:
    out = {}
    for name, (depths, patch, size) in _NAMED.items():
        # The AugReg files spell the names without "ViT-" and with "_" for "+" (R26_S_32, B_16).
        for spelling in (name, name.replace("ViT-", "").replace("+", "_")):
            out[spelling] = Variant(spelling, depths, patch, *_SIZES[size])
    return out


VARIANTS: dict[str, Variant] = _variants()


def variant_in_name(filename: str) -> Variant | None:
    """The vit_jax model a file name names (``R50+ViT-B_16.npz``, ``imagenet21k_ViT-B_16.npz``,
    ``R26_S_32-i21k-300ep-...npz``), the longest name first; None when it names none."""
    base = Path(filename).name
    for name in sorted(VARIANTS, key=len, reverse=True):
        if re.search(rf"(^|[_/]){re.escape(name)}(-|\.npz$|$)", base):
            return VARIANTS[name]
    return None


# --- reading --------------------------------------------------------------------------------------------------


def read_npz(path: str | Path) -> dict[str, np.ndarray]:
    """A ``.npz`` -> its arrays as float32, read with ``allow_pickle=False`` after the zip's CRCs are checked.

    Raises :class:`ConvertError` for a file that is not a readable ``.npz``, object arrays (pickles), and arrays
    that are not floating point.
    """
    path = Path(path)
    if not path.is_file():
        raise ConvertError(f"{path} is not a file.")
    if not zipfile.is_zipfile(path):
        raise ConvertError(f"{path.name} is not a .npz file (a zip of .npy arrays), as the ViT checkpoints are.")
    check_archive(path)
    out: dict[str, np.ndarray] = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for key in data.files:
                try:
                    arr = data[key]
                except ValueError as exc:
                    if "allow_pickle" in str(exc) or "Object arrays" in str(exc):
                        raise ConvertError(
                            f"{path.name} holds object arrays ({key[:80]}: a pickle), which only code could rebuild; "
                            "vitviz reads numeric arrays only (numpy.load(allow_pickle=False)). Nothing was written."
                        ) from None
                    raise
                if arr.dtype.kind != "f":
                    raise ConvertError(
                        f"{path.name}: array {key[:80]} has dtype {arr.dtype}, not floating point: not a checkpoint "
                        "vitviz can read (the ViT checkpoints hold float32 arrays). Nothing was written."
                    )
                out[key] = np.asarray(arr, dtype=np.float32)
    except ConvertError:
        raise
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ConvertError(
            f"{path.name} cannot be read as a .npz file: {str(exc)[:200]}. Nothing was written."
        ) from None
    if not out:
        raise ConvertError(f"{path.name} holds no arrays.")
    if all(k.startswith("opt/target/") for k in out):  # checkpoints saved with their optimizer's wrapper (timm too)
        out = {k[len("opt/target/") :]: v for k, v in out.items()}
    return out


@dataclass(frozen=True)
class Layout:
    """The sizes a checkpoint's arrays describe.

    ``block_names``: the names of a block's LayerNorms, attention and MLP (pre-linen or linen numbering).
    ``num_classes``: the head's classes (None: no head). ``grid``: the position table's side.
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    intermediate_size: int
    patch_size: int
    num_channels: int
    grid: int
    resnet_depths: tuple[int, ...] | None
    resnet_width: int
    representation_size: int | None
    num_classes: int | None
    block_names: tuple[str, str, str, str]

    @property
    def total_stride(self) -> int:
        cnn = 1 if self.resnet_depths is None else 4 * 2 ** max(0, len(self.resnet_depths) - 1)
        return cnn * self.patch_size

    @property
    def image_size(self) -> int:
        return self.grid * self.total_stride


_PRE_LINEN = ("LayerNorm_0", "MultiHeadDotProductAttention_1", "LayerNorm_2", "MlpBlock_3")
_LINEN = ("LayerNorm_0", "MultiHeadDotProductAttention_0", "LayerNorm_1", "MlpBlock_0")
_ANCHORS = ("embedding/kernel", "Transformer/posembed_input/pos_embedding", "Transformer/encoder_norm/scale")


def _not_vit(name: str, arrays: dict[str, np.ndarray], why: str) -> ConvertError:
    first = ", ".join(sorted(arrays)[:SHOWN])
    hint = ""
    if any(k.startswith("MixerBlock") for k in arrays):
        hint = " It looks like an MLP-Mixer checkpoint."
    elif any(k.startswith(("params/", "img/", "txt/")) for k in arrays):
        hint = " It looks like a big_vision or LiT checkpoint, whose layout vit-npz does not read."
    return ConvertError(
        f"{name} is not a checkpoint of the ViT paper's JAX code (vit_jax): {why} (its first arrays: {first}).{hint} "
        "Nothing was written."
    )


def read_layout(arrays: dict[str, np.ndarray], name: str = "the checkpoint") -> Layout:
    """The sizes the arrays describe (see the module docstring); raises :class:`ConvertError` when the anchor arrays
    of a vit_jax ViT are missing or malformed. Completeness and every shape are checked later, against the
    arrays these sizes imply."""
    missing = [k for k in _ANCHORS if k not in arrays]
    if missing:
        raise _not_vit(name, arrays, f"it has no {', '.join(missing)}")
    if "cls" not in arrays:
        raise ConvertError(
            f"{name} has no 'cls' token: a model that reads the mean of its tokens (vit_jax's classifier 'gap'), "
            "which vit-npz does not convert (the published ViT and hybrid checkpoints read the CLS token). "
            "Nothing was written."
        )
    emb = arrays["embedding/kernel"]
    if emb.ndim != 4 or emb.shape[0] != emb.shape[1]:
        raise _not_vit(name, arrays, f"embedding/kernel has shape {emb.shape}, not (p, p, C, D)")
    p, _, c_in, d = emb.shape
    blocks = sorted({int(m.group(1)) for k in arrays if (m := re.match(r"Transformer/encoderblock_(\d+)/", k))})
    if not blocks:
        raise _not_vit(name, arrays, "it has no Transformer/encoderblock_0")
    names = _PRE_LINEN if f"Transformer/encoderblock_0/{_PRE_LINEN[1]}/query/kernel" in arrays else _LINEN
    query = arrays.get(f"Transformer/encoderblock_0/{names[1]}/query/kernel")
    dense = arrays.get(f"Transformer/encoderblock_0/{names[3]}/Dense_0/kernel")
    if query is None or query.ndim != 3 or dense is None or dense.ndim != 2:
        raise _not_vit(name, arrays, "its first block has no attention query kernel (D, heads, d) or MLP kernel (D, M)")
    pos = arrays["Transformer/posembed_input/pos_embedding"]
    if pos.ndim != 3 or pos.shape[0] != 1:
        raise _not_vit(name, arrays, f"its position table has shape {pos.shape}, not (1, 1 + N, D)")
    n = pos.shape[1] - 1
    side = math.isqrt(max(n, 0))
    if n < 1 or side * side != n:
        raise ConvertError(
            f"{name}: the position table has {pos.shape[1]} rows, which is not 1 (CLS) + a square grid. "
            "Nothing was written."
        )
    depths, width = None, 0
    if "conv_root/kernel" in arrays:
        root = arrays["conv_root/kernel"]
        if root.ndim != 4:
            raise _not_vit(name, arrays, f"conv_root/kernel has shape {root.shape}, not (7, 7, 3, width)")
        width, c_in = int(root.shape[3]), int(root.shape[2])
        units: dict[int, int] = {}
        for k in arrays:
            if m := re.match(r"block(\d+)/unit(\d+)/", k):
                units[int(m.group(1))] = max(units.get(int(m.group(1)), 0), int(m.group(2)))
        # every stage up to the last one present (a gap is then reported as missing arrays)
        depths = tuple(units.get(s, 0) for s in range(1, max(units, default=0) + 1))
    rep = arrays["pre_logits/kernel"].shape[-1] if "pre_logits/kernel" in arrays else None
    classes = arrays["head/kernel"].shape[-1] if "head/kernel" in arrays else None
    return Layout(
        hidden_size=int(d),
        num_hidden_layers=blocks[-1] + 1,
        num_attention_heads=int(query.shape[1]),
        head_dim=int(query.shape[2]),
        intermediate_size=int(dense.shape[1]),
        patch_size=int(p),
        num_channels=int(c_in),
        grid=side,
        resnet_depths=depths,
        resnet_width=width,
        representation_size=None if rep is None else int(rep),
        num_classes=None if classes is None else int(classes),
        block_names=names,
    )


# --- vit_jax arrays -> state dicts --------------------------------------------------------------------------


@dataclass
class _Plan:
    """Each expected array: its name in the file, its shape there, and where it goes (our key, a transform)."""

    entries: list[tuple[str, tuple[int, ...], str, Callable[[np.ndarray], np.ndarray]]] = field(default_factory=list)

    def add(self, npz: str, shape: tuple[int, ...], ours: str, fn: Callable[[np.ndarray], np.ndarray]) -> None:
        self.entries.append((npz, tuple(int(s) for s in shape), ours, fn))


def _conv(a: np.ndarray) -> np.ndarray:  # flax (kh, kw, in, out) -> torch (out, in, kh, kw)
    return a.transpose(3, 2, 0, 1)


def _dense(a: np.ndarray) -> np.ndarray:  # flax (in, out) -> torch (out, in)
    return a.T


def _flat(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1)


def _same(a: np.ndarray) -> np.ndarray:
    return a


def _plan(lay: Layout, prefix: str, hybrid: bool) -> _Plan:
    """Every array a checkpoint of layout ``lay`` must hold, with its shape, our key under ``prefix`` and its
    transform. ``hybrid``: vitviz's zoo class (``embeddings.projection``, ``layers``, ``pre_logits``); else HF ViT
    (``embeddings.patch_embeddings.projection``; no representation layer there)."""
    d, h, hd, m, p = lay.hidden_size, lay.num_attention_heads, lay.head_dim, lay.intermediate_size, lay.patch_size
    plan = _Plan()
    emb = f"{prefix}embeddings."
    proj = f"{emb}projection" if hybrid else f"{emb}patch_embeddings.projection"
    c_in = lay.num_channels
    if lay.resnet_depths is not None:
        w = lay.resnet_width
        bb = f"{emb}backbone."
        plan.add("conv_root/kernel", (7, 7, lay.num_channels, w), f"{bb}embedder.convolution.weight", _conv)
        plan.add("gn_root/scale", (w,), f"{bb}embedder.norm.weight", _flat)
        plan.add("gn_root/bias", (w,), f"{bb}embedder.norm.bias", _flat)
        c_in = w
        for s, depth in enumerate(lay.resnet_depths):
            mid, out = w * 2**s, 4 * w * 2**s
            for u in range(max(depth, 1)):  # a stage without units (a gap) still needs its first unit
                src, dst = f"block{s + 1}/unit{u + 1}/", f"{bb}encoder.stages.{s}.layers.{u}."
                ins = c_in if u == 0 else out
                for j, (k, i_ch, o_ch) in enumerate(((1, ins, mid), (3, mid, mid), (1, mid, out)), 1):
                    plan.add(f"{src}conv{j}/kernel", (k, k, i_ch, o_ch), f"{dst}conv{j}.weight", _conv)
                    plan.add(f"{src}gn{j}/scale", (o_ch,), f"{dst}norm{j}.weight", _flat)
                    plan.add(f"{src}gn{j}/bias", (o_ch,), f"{dst}norm{j}.bias", _flat)
                if u == 0:
                    plan.add(f"{src}conv_proj/kernel", (1, 1, ins, out), f"{dst}downsample.conv.weight", _conv)
                    plan.add(f"{src}gn_proj/scale", (out,), f"{dst}downsample.norm.weight", _flat)
                    plan.add(f"{src}gn_proj/bias", (out,), f"{dst}downsample.norm.bias", _flat)
            c_in = out
    plan.add("embedding/kernel", (p, p, c_in, d), f"{proj}.weight", _conv)
    plan.add("embedding/bias", (d,), f"{proj}.bias", _same)
    plan.add("cls", (1, 1, d), f"{emb}cls_token", _same)
    plan.add("Transformer/posembed_input/pos_embedding", (1, 1 + lay.grid**2, d), f"{emb}position_embeddings", _same)
    ln1, att, ln2, mlp = lay.block_names
    for i in range(lay.num_hidden_layers):
        src, dst = f"Transformer/encoderblock_{i}/", f"{prefix}layers.{i}."
        for ln, ours in ((ln1, "layernorm_before"), (ln2, "layernorm_after")):
            plan.add(f"{src}{ln}/scale", (d,), f"{dst}{ours}.weight", _same)
            plan.add(f"{src}{ln}/bias", (d,), f"{dst}{ours}.bias", _same)
        for qkv in ("query", "key", "value"):
            plan.add(f"{src}{att}/{qkv}/kernel", (d, h, hd), f"{dst}attention.{qkv[0]}_proj.weight", _qkv)
            plan.add(f"{src}{att}/{qkv}/bias", (h, hd), f"{dst}attention.{qkv[0]}_proj.bias", _flat)
        plan.add(f"{src}{att}/out/kernel", (h, hd, d), f"{dst}attention.o_proj.weight", _out)
        plan.add(f"{src}{att}/out/bias", (d,), f"{dst}attention.o_proj.bias", _same)
        plan.add(f"{src}{mlp}/Dense_0/kernel", (d, m), f"{dst}mlp.fc1.weight", _dense)
        plan.add(f"{src}{mlp}/Dense_0/bias", (m,), f"{dst}mlp.fc1.bias", _same)
        plan.add(f"{src}{mlp}/Dense_1/kernel", (m, d), f"{dst}mlp.fc2.weight", _dense)
        plan.add(f"{src}{mlp}/Dense_1/bias", (d,), f"{dst}mlp.fc2.bias", _same)
    plan.add("Transformer/encoder_norm/scale", (d,), f"{prefix}layernorm.weight", _same)
    plan.add("Transformer/encoder_norm/bias", (d,), f"{prefix}layernorm.bias", _same)
    width = d
    if lay.representation_size is not None:
        plan.add("pre_logits/kernel", (d, lay.representation_size), f"{prefix}pre_logits.weight", _dense)
        plan.add("pre_logits/bias", (lay.representation_size,), f"{prefix}pre_logits.bias", _same)
        width = lay.representation_size
    if lay.num_classes is not None:
        plan.add("head/kernel", (width, lay.num_classes), "classifier.weight", _dense)
        plan.add("head/bias", (lay.num_classes,), "classifier.bias", _same)
    return plan


def _qkv(a: np.ndarray) -> np.ndarray:  # (D, H, d) -> (H * d, D): head h in rows h*d .. (h+1)*d - 1
    return a.reshape(a.shape[0], -1).T


def _out(a: np.ndarray) -> np.ndarray:  # (H, d, D) -> (D, H * d): head h in columns h*d .. (h+1)*d - 1
    return a.reshape(-1, a.shape[-1]).T


def _fits(got: tuple[int, ...], want: tuple[int, ...], npz: str) -> bool:
    """Shapes agree; a group norm's ``(C,)`` may come as older flax's ``(1, 1, 1, C)``."""
    if got == want:
        return True
    return bool(re.search(r"(^|/)gn(\d+|_root|_proj)/(scale|bias)$", npz)) and got == (1, 1, 1, *want)


def _mapped(arrays: dict[str, np.ndarray], plan: _Plan, name: str) -> dict[str, torch.Tensor]:
    """Our state dict from the arrays; every array is expected, present and of its shape, or nothing is returned."""
    wanted = {npz for npz, *_ in plan.entries}
    missing = [npz for npz, *_ in plan.entries if npz not in arrays]
    extra = [k for k in arrays if k not in wanted]
    shapes = [
        f"{npz}: {tuple(arrays[npz].shape)} in the file, {shape} expected"
        for npz, shape, *_ in plan.entries
        if npz in arrays and not _fits(tuple(arrays[npz].shape), shape, npz)
    ]
    problems = []
    for what, keys in (("missing", missing), ("that do not belong to it", extra), ("of another shape", shapes)):
        if keys:
            more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
            problems.append(f"{len(keys)} arrays {what}: {'; '.join(keys[:SHOWN])}{more}")
    if problems:
        raise ConvertError(
            f"{name} does not have the arrays of the model its sizes describe: " + ". ".join(problems) + ". "
            "Is it a checkpoint of another architecture, or damaged? Nothing was written."
        )
    bad = [npz for npz, *_ in plan.entries if not np.isfinite(arrays[npz]).all()]
    if bad:
        raise ConvertError(
            f"{name} has NaN or infinite values in {len(bad)} arrays ({', '.join(bad[:SHOWN])}"
            f"{' ...' if len(bad) > SHOWN else ''}): it is damaged. Nothing was written."
        )
    return {
        ours: torch.from_numpy(np.ascontiguousarray(fn(arrays[npz].reshape(shape)))).float()
        for npz, shape, ours, fn in plan.entries
    }


# --- converting -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NpzReport:
    """What :func:`convert_vit_npz` wrote: the folder, the class the weights went to, the model name it was
    checked against (None: sizes read from the arrays only), and notes."""

    out: Path
    model_class: str
    variant: str | None
    layout: Layout
    notes: tuple[str, ...] = ()


def _check_variant(lay: Layout, variant: Variant, name: str, source: str) -> None:
    """Refuse arrays whose sizes contradict the vit_jax model ``variant`` (naming each difference)."""
    pairs = [
        ("ResNet depths", variant.resnet_depths, lay.resnet_depths),
        ("embedding patch", variant.patch_size, lay.patch_size),
        ("hidden size", variant.hidden_size, lay.hidden_size),
        ("blocks", variant.num_hidden_layers, lay.num_hidden_layers),
        ("heads", variant.num_attention_heads, lay.num_attention_heads),
        ("MLP size", variant.intermediate_size, lay.intermediate_size),
    ]
    wrong = [(what, want, got) for what, want, got in pairs if want != got]
    if not wrong:
        return

    def show(v) -> str:
        return "none (no ResNet)" if v is None else str(tuple(v)) if isinstance(v, tuple) else str(v)

    said = "; ".join(f"{what} {show(want)} in {variant.name}, {show(got)} in the arrays" for what, want, got in wrong)
    raise ConvertError(
        f"{name} does not match {variant.name} ({source}): {said}. Give the right --variant, or convert another "
        "file. Nothing was written."
    )


def convert_vit_npz(
    checkpoint: str | Path,
    out: str | Path,
    *,
    variant: str | None = None,
    num_classes: int | None = None,
    labels: list[str] | None = None,
    overwrite: bool = False,
) -> NpzReport:
    """Convert one of the ViT paper's ``.npz`` checkpoints into a folder vitviz loads (see the module docstring).

    ``variant``: the vit_jax model name to check the arrays against (default: the one the file name holds, if
    any). ``num_classes``: the classes the head must have (e.g. 1000 for an ImageNet-1k fine-tune). ``labels``:
    one name per class. Raises :class:`ConvertError` (nothing written) on any mismatch.
    """
    checkpoint, out = Path(checkpoint), Path(out)
    name = checkpoint.name
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConvertError(f"{out} exists and is not empty; choose another --out.")
    if variant is not None and variant not in VARIANTS:
        raise ConvertError(f"Unknown --variant '{variant[:80]}'. Known vit_jax names: {', '.join(VARIANTS)}.")
    arrays = read_npz(checkpoint)
    lay = read_layout(arrays, name)
    notes = []
    chosen = VARIANTS[variant] if variant is not None else variant_in_name(name)
    if chosen is not None:
        _check_variant(lay, chosen, name, "--variant" if variant is not None else "the name in the file name")
    else:
        notes.append("no vit_jax model name in the file name: the sizes were read from the arrays alone")
    classes = lay.num_classes
    if classes is None and (num_classes is not None or labels is not None):
        raise ConvertError(f"{name} has no head (no head/kernel), so it has no classes to name. Nothing was written.")
    for asked, what in ((num_classes, "--num-classes"), (None if labels is None else len(labels), "--labels")):
        if asked is not None and classes is not None and asked != classes:
            known = f" (the {_DATASET_CLASSES[classes]} label set)" if classes in _DATASET_CLASSES else ""
            raise ConvertError(
                f"{name}'s head has {classes} classes{known}, but {what} asks for {asked}: it is a checkpoint of "
                f"another data set{' (a pre-training checkpoint, not a fine-tune)' if classes == IMAGENET21K_CLASSES else ''}. "
                "Convert the fine-tuned file, or leave the option out. Nothing was written."
            )

    if lay.hidden_size != lay.num_attention_heads * lay.head_dim:
        raise ConvertError(
            f"{name}: {lay.num_attention_heads} heads of width {lay.head_dim} do not make its width "
            f"{lay.hidden_size}. Nothing was written."
        )
    hybrid = lay.resnet_depths is not None or lay.representation_size is not None or classes is None
    if hybrid:
        from vitviz.zoo.hybrid import HybridViTConfig, HybridViTForImageClassification, HybridViTModel

        config = HybridViTConfig(
            image_size=lay.image_size,
            num_channels=lay.num_channels,
            hidden_size=lay.hidden_size,
            num_hidden_layers=lay.num_hidden_layers,
            num_attention_heads=lay.num_attention_heads,
            intermediate_size=lay.intermediate_size,
            patch_size=lay.patch_size,
            resnet_depths=lay.resnet_depths,
            resnet_width=lay.resnet_width or 64,
            representation_size=lay.representation_size,
            num_labels=classes or 1,
        )
        model_class = HybridViTForImageClassification if classes is not None else HybridViTModel
        prefix = "vit." if classes is not None else ""
        if lay.representation_size is not None and lay.resnet_depths is None:
            notes.append(
                "the checkpoint has a representation layer (pre_logits), which transformers' ViT has no place for: "
                "it is kept in vitviz's own class (hybrid_vit without a ResNet)"
            )
    else:
        from transformers import ViTConfig, ViTForImageClassification

        config = ViTConfig(
            image_size=lay.image_size,
            patch_size=lay.patch_size,
            num_channels=lay.num_channels,
            hidden_size=lay.hidden_size,
            num_hidden_layers=lay.num_hidden_layers,
            num_attention_heads=lay.num_attention_heads,
            intermediate_size=lay.intermediate_size,
            hidden_act="gelu_pytorch_tanh",  # flax.linen.gelu is the tanh approximation
            layer_norm_eps=1e-6,  # flax's LayerNorm
            qkv_bias=True,
            num_labels=classes,
        )
        model_class, prefix = ViTForImageClassification, "vit."
    if labels is not None:
        config.id2label = dict(enumerate(labels))
        config.label2id = {v: k for k, v in config.id2label.items()}
    try:
        state = _mapped(arrays, _plan(lay, prefix, hybrid), name)
        with torch.device("meta"):  # shapes only: the weights come from the file
            want = model_class(config).state_dict()
    except ValueError as exc:  # a config the sizes cannot make (e.g. heads that do not divide the width)
        raise ConvertError(f"{name}: {exc}. Nothing was written.") from None
    _check(state, want, f"{model_class.__name__} of these sizes")
    model = model_class(config).eval()
    model.load_state_dict(state, strict=True)

    from transformers import ViTImageProcessor

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        side = lay.image_size
        ViTImageProcessor(
            size={"height": side, "width": side},
            image_mean=[0.5, 0.5, 0.5],  # the paper's normalisation: pixels to [-1, 1]
            image_std=[0.5, 0.5, 0.5],
            resample=2,  # bilinear, as vit_jax's input pipeline resizes
        ).save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return NpzReport(out, model_class.__name__, None if chosen is None else chosen.name, lay, tuple(notes))
