"""``python -m vitviz convert --arch open_clip --checkpoint FOLDER --out DIR``: an open_clip CLIP -> an HF CLIP folder.

An open_clip folder holds ``open_clip_config.json`` (``{"model_cfg": {...}, "preprocess_cfg":
{...}}``) and ``open_clip_pytorch_model.bin`` or ``open_clip_model.safetensors`` /
``open_clip_pytorch_model.safetensors``. The ``.bin`` is read with
``torch.load(weights_only=True)`` only (a pickle that carries code is refused). Where it maps
(open_clip's own ``VisionTransformer`` and ``TextTransformer``), the weights become a
``transformers`` ``CLIPModel``, key by key:

* image tower: ``visual.conv1`` -> ``patch_embedding`` (no bias), ``class_embedding``,
  ``positional_embedding``, ``ln_pre`` -> ``pre_layrnorm``, ``ln_post`` -> ``post_layernorm``,
  ``visual.proj`` ``(width, embed)`` -> ``visual_projection.weight`` transposed;
* text tower: ``token_embedding``, ``positional_embedding``, ``ln_final`` -> ``final_layer_norm``,
  ``text_projection`` ``(width, embed)`` -> ``text_projection.weight`` transposed;
* each residual block: ``ln_1``/``ln_2`` -> ``layer_norm1``/``layer_norm2``, ``attn.in_proj_weight``
  and ``in_proj_bias`` split in thirds -> ``q_proj``, ``k_proj``, ``v_proj``, ``attn.out_proj`` ->
  ``out_proj``, ``mlp.c_fc``/``mlp.c_proj`` -> ``mlp.fc1``/``mlp.fc2``;
* ``logit_scale`` as is. GELU is exact (``gelu``) unless the config says ``quick_gelu``.

The text tower pools as open_clip does (``argmax``: the highest token id, CLIP's end-of-text
token): the HF config gets ``eos_token_id = 2``, the value for which ``CLIPTextTransformer``
pools at the argmax of the ids. The zero-shot logits are then open_clip's
``logit_scale.exp() * normalize(image) @ normalize(text).T``.

Preprocessing: open_clip's evaluation (``resize_mode`` ``"shortest"``, its default: the short side
resized to the input size, bicubic, then the centre square) is written as the folder's processor, and
``vitviz.json`` asks vitviz to honour the crop (:func:`vitviz.zoo.convert.write_center_crop`), so that a
photo that is not square scores as in open_clip; ``"squash"`` is kept; ``"longest"`` (padding) is
squashed instead, with a note.

Refused with a message, nothing written: towers open_clip builds from timm (ConvNeXt, ...) or
Hugging Face text models, ResNet image towers, layer scale, attentional poolers, projection
biases, other pooling, a ``logit_bias`` (SigLIP-style), open_clip 3.x's custom attention block
(``qk_norm``, ``scaled_cosine_attn``, ``scale_heads``, ``scale_attn_inner``, ``scale_attn``,
``scale_fc``, ``block_type``: named by the option), and weights whose keys or shapes do not fit the
config. The config is checked before anything is built from it: at most 1 MB of JSON,
every size a whole number in a stated range (:data:`BOUNDS`: at most 64 layers, width 4,096,
64 heads, a vocabulary of 500,000, ...), ``mlp_ratio`` a finite number, widths multiples of
their heads. The model is then built on PyTorch's ``meta`` device (shapes, no memory) and its
keys and shapes compared with the weights; only a config that fits them is built for real (a
width of 4,096 beside weights of width 32 took 1.1 GB before it was compared). The tokenizer is
written where the folder holds CLIP's BPE tokenizer files
(``tokenizer.json`` or ``vocab.json`` + ``merges.txt``) and the config names no other tokenizer;
otherwise the folder works without labels and the report says why.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from vitviz.zoo.convert import ConvertError, _check, read_state_dict

__all__ = ["BOUNDS", "OpenClipReport", "convert_open_clip", "hf_clip_config", "map_open_clip"]

CONFIG = "open_clip_config.json"
WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors", "open_clip_pytorch_model.bin")
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)

# config keys whose presence (with a value other than the default) means a tower HF CLIP cannot hold
_VISION_UNMAPPABLE = {
    "timm_model_name": "a timm image tower (e.g. ConvNeXt)",
    "ls_init_value": "layer scale in the image tower",
    "attentional_pool": "an attentional pooler",
    "attn_pooler_queries": None,
    "global_average_pool": "average pooling instead of the class token",
    "no_ln_pre": "no pre-norm",
    "final_ln_after_pool": "a final norm after pooling",
    "input_patchnorm": "patch norm on the input",
    "proj_bias": "a projection bias",
    "act_kwargs": "other activation settings",
    "norm_kwargs": "other norm settings",
}
_TEXT_UNMAPPABLE = {
    "hf_model_name": "a Hugging Face text model",
    "ls_init_value": "layer scale in the text tower",
    "no_causal_mask": "a text tower without causal mask",
    "embed_cls": "a class token in the text tower (CoCa)",
    "proj_bias": "a projection bias",
    "act_kwargs": "other activation settings",
    "norm_kwargs": "other norm settings",
    "attn_pooler_heads": None,
}
_DEFAULT_OK = {"attn_pooler_queries": 256, "attn_pooler_heads": 8, "block_type": "default"}
# open_clip 3.x's custom attention block (either tower): named by its option, not by the weights it adds
_CUSTOM_BLOCK = {
    "block_type": "open_clip's custom attention block (block_type)",
    "qk_norm": "LayerNorm on queries and keys (qk_norm)",
    "scaled_cosine_attn": "scaled cosine attention (scaled_cosine_attn)",
    "scale_heads": "a learned scale per head (scale_heads)",
    "scale_attn_inner": "a LayerNorm on the attention output before its projection (scale_attn_inner)",
    "scale_attn": "a LayerNorm after attention (scale_attn)",
    "scale_fc": "a LayerNorm inside the MLP (scale_fc)",
}
_VISION_UNMAPPABLE.update(_CUSTOM_BLOCK)
_TEXT_UNMAPPABLE.update(_CUSTOM_BLOCK)
MAX_CONFIG_BYTES = 2**20  # open_clip_config.json; real ones are about 1 KB
# What a config may ask for (inclusive ranges), well above every public open_clip ViT (ViT-bigG/14: 48 layers of
# width 1664, text width 1280; vocabularies of 49,408 to 250,000): the hub check's bounds (vitviz.serve.hub_checks).
BOUNDS = {
    "layers": (1, 64),
    "width": (1, 4096),
    "head_width": (1, 4096),
    "heads": (1, 64),
    "embed_dim": (1, 4096),
    "image_size": (1, 2048),
    "patch_size": (1, 2048),
    "vocab_size": (3, 500_000),  # CLIP's BPE: <|startoftext|> and <|endoftext|> are its last two ids
    "context_length": (1, 16_384),
    "intermediate": (1, 16_384),  # width * mlp_ratio
    "tokens": (1, 16_384),  # (image_size / patch_size) ** 2
}


class OpenClipReport:
    """What :func:`convert_open_clip` wrote: the folder and notes (e.g. why no tokenizer)."""

    def __init__(self, out: Path, notes: list[str]) -> None:
        self.out, self.notes = out, notes


def _unmappable(cfg: dict, table: dict, tower: str) -> list[str]:
    found = []
    for key, what in table.items():
        value = cfg.get(key)
        if value in (None, False, 0, {}, "", _DEFAULT_OK.get(key)):
            continue
        found.append(what or key)
    return [f"{tower}: {w}" for w in found]


def _read_config(folder: Path) -> dict:
    path = folder / CONFIG
    if not path.is_file():
        raise ConvertError(f"{folder} has no {CONFIG}: an open_clip folder holds it beside the weights.")
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:  # checked before reading: a 180 MB "config" was read and accepted
            raise ConvertError(f"{path} is larger than 1 MB: not an open_clip config. Nothing was written.")
        data = json.loads(path.read_text())
    except RecursionError:
        raise ConvertError(f"{path} is nested too deeply to be an open_clip config. Nothing was written.") from None
    except (OSError, ValueError) as exc:
        raise ConvertError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_cfg", data), dict):
        raise ConvertError(f"{path} holds no model_cfg.")
    return data


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return repr(value)[:60]


def _bad(where: str, value: Any, what: str) -> ConvertError:
    return ConvertError(f"In {CONFIG}, {where} = {_shown(value)} is not {what}. Nothing was written.")


def _whole(cfg: dict, key: str, default: int, where: str, bound: str | None = None) -> int:
    """``cfg[key]`` (``default`` when absent): a whole number within ``BOUNDS[bound or key]``."""
    value = cfg.get(key, default)
    lo, hi = BOUNDS[bound or key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _bad(f"{where}{key}", value, f"a whole number from {lo:,} to {hi:,}")
    return value


def _ratio(cfg: dict, where: str, width: int) -> int:
    """The MLP width ``width * mlp_ratio``: a finite positive ratio, within ``BOUNDS["intermediate"]``."""
    value = cfg.get("mlp_ratio", 4.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise _bad(f"{where}mlp_ratio", value, "a finite positive number")
    inner = int(width * float(value))
    lo, hi = BOUNDS["intermediate"]
    if not lo <= inner <= hi:
        raise _bad(
            f"{where}mlp_ratio", value, f"a ratio giving an MLP width from {lo:,} to {hi:,} (it gives {inner:,})"
        )
    return inner


def _side(cfg: dict, key: str, default: int, where: str) -> int:
    """``image_size`` or ``patch_size``: one number, or a list of equal ones (a square)."""
    value = cfg.get(key, default)
    if isinstance(value, (list, tuple)):
        if not value or len(value) > 2 or len(set(map(repr, value))) > 1:
            raise ConvertError("Non-square patches or images do not map to Hugging Face CLIP; nothing was written.")
        value = value[0]
    return _whole({key: value}, key, default, where)


def hf_clip_config(model_cfg: dict):
    """The ``transformers`` ``CLIPConfig`` of an open_clip ``model_cfg``; :class:`ConvertError` where none fits."""
    from transformers import CLIPConfig

    for key in ("vision_cfg", "text_cfg"):
        if model_cfg.get(key) is not None and not isinstance(model_cfg[key], dict):
            raise ConvertError(
                f"In {CONFIG}, {key} must be a table of settings, not {type(model_cfg[key]).__name__}. "
                "Nothing was written."
            )
    vision, text = model_cfg.get("vision_cfg") or {}, model_cfg.get("text_cfg") or {}
    problems = _unmappable(vision, _VISION_UNMAPPABLE, "image tower") + _unmappable(
        text, _TEXT_UNMAPPABLE, "text tower"
    )
    if isinstance(vision.get("layers", 12), (list, tuple)):
        problems.append("image tower: a ResNet (layers given per stage)")
    if vision.get("pool_type", "tok") != "tok":
        problems.append(f"image tower: pooling '{vision.get('pool_type')}' (HF CLIP reads the class token)")
    if text.get("pool_type", "argmax") != "argmax":
        problems.append(f"text tower: pooling '{text.get('pool_type')}' (HF CLIP reads the end-of-text token)")
    if vision.get("pos_embed_type", "learnable") != "learnable":
        problems.append(f"image tower: position embedding '{vision.get('pos_embed_type')}'")
    if model_cfg.get("init_logit_bias") is not None:
        problems.append("a logit bias (SigLIP-style sigmoid loss)")
    if problems:
        raise ConvertError(
            "This open_clip model does not map to Hugging Face CLIP (" + "; ".join(problems) + "). "
            "vitviz converts open_clip's own ViT image tower with its own text transformer; nothing was written."
        )
    # every size is checked before anything is built from it (types, ranges, divisibility): issue 33.11
    v, t = "vision_cfg.", "text_cfg."
    width = _whole(vision, "width", 768, v)
    head_width = _whole(vision, "head_width", 64, v)
    if width % head_width:
        raise ConvertError(
            f"In {CONFIG}, vision_cfg.width {width} is not a multiple of its head_width {head_width}. Nothing was "
            "written."
        )
    patch, size = _side(vision, "patch_size", 16, v), _side(vision, "image_size", 224, v)
    tokens = (size // patch) ** 2
    if not BOUNDS["tokens"][0] <= tokens <= BOUNDS["tokens"][1]:
        raise _bad(
            f"{v}image_size / patch_size", f"{size} / {patch}", f"a grid of 1 to {BOUNDS['tokens'][1]:,} patches"
        )
    t_width, t_heads = _whole(text, "width", 512, t), _whole(text, "heads", 8, t)
    if t_width % t_heads:
        raise ConvertError(
            f"In {CONFIG}, text_cfg.width {t_width} is not a multiple of its heads {t_heads}. Nothing was written."
        )
    vocab = _whole(text, "vocab_size", 49408, t)
    act = "quick_gelu" if model_cfg.get("quick_gelu") else "gelu"
    return CLIPConfig(
        projection_dim=_whole(model_cfg, "embed_dim", 512, ""),
        vision_config={
            "hidden_size": width,
            "intermediate_size": _ratio(vision, v, width),
            "num_hidden_layers": _whole(vision, "layers", 12, v),
            "num_attention_heads": width // head_width,
            "image_size": size,
            "patch_size": patch,
            "hidden_act": act,
            "layer_norm_eps": 1e-5,
        },
        text_config={
            "vocab_size": vocab,
            "hidden_size": t_width,
            "intermediate_size": _ratio(text, t, t_width),
            "num_hidden_layers": _whole(text, "layers", 12, t),
            "num_attention_heads": t_heads,
            "max_position_embeddings": _whole(text, "context_length", 77, t),
            "hidden_act": act,
            "layer_norm_eps": 1e-5,
            "eos_token_id": 2,  # CLIPTextTransformer then pools at the argmax of the ids, as open_clip does
            "bos_token_id": vocab - 2,  # CLIP's BPE: <|startoftext|>, then <|endoftext|>
            "pad_token_id": 0,  # open_clip pads with 0
        },
    )


def _blocks(sd: dict, src: str, dst: str, n: int, out: dict) -> None:
    for i in range(n):
        s, d = f"{src}.{i}", f"{dst}.{i}"
        for a, b in (("ln_1", "layer_norm1"), ("ln_2", "layer_norm2")):
            out[f"{d}.{b}.weight"] = sd.pop(f"{s}.{a}.weight")
            out[f"{d}.{b}.bias"] = sd.pop(f"{s}.{a}.bias")
        w, b = sd.pop(f"{s}.attn.in_proj_weight"), sd.pop(f"{s}.attn.in_proj_bias")
        if w.shape[0] % 3 or b.shape[0] != w.shape[0]:
            raise ConvertError(f"{s}.attn.in_proj_weight {tuple(w.shape)} is not three stacked projections.")
        for part, wp, bp in zip(("q_proj", "k_proj", "v_proj"), w.chunk(3), b.chunk(3), strict=True):
            out[f"{d}.self_attn.{part}.weight"], out[f"{d}.self_attn.{part}.bias"] = wp, bp
        out[f"{d}.self_attn.out_proj.weight"] = sd.pop(f"{s}.attn.out_proj.weight")
        out[f"{d}.self_attn.out_proj.bias"] = sd.pop(f"{s}.attn.out_proj.bias")
        for a, b2 in (("c_fc", "fc1"), ("c_proj", "fc2")):
            out[f"{d}.mlp.{b2}.weight"] = sd.pop(f"{s}.mlp.{a}.weight")
            out[f"{d}.mlp.{b2}.bias"] = sd.pop(f"{s}.mlp.{a}.bias")


def map_open_clip(state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """open_clip's CLIP state dict -> ``CLIPModel``'s (module docstring); :class:`ConvertError` on a missing key."""
    sd = dict(state)
    out: dict[str, torch.Tensor] = {}
    try:
        v = "vision_model"
        out[f"{v}.embeddings.class_embedding"] = sd.pop("visual.class_embedding")
        out[f"{v}.embeddings.patch_embedding.weight"] = sd.pop("visual.conv1.weight")
        out[f"{v}.embeddings.position_embedding.weight"] = sd.pop("visual.positional_embedding")
        for a, b in (("ln_pre", "pre_layrnorm"), ("ln_post", "post_layernorm")):
            out[f"{v}.{b}.weight"], out[f"{v}.{b}.bias"] = sd.pop(f"visual.{a}.weight"), sd.pop(f"visual.{a}.bias")
        _blocks(sd, "visual.transformer.resblocks", f"{v}.encoder.layers", config.vision_config.num_hidden_layers, out)
        out["visual_projection.weight"] = sd.pop("visual.proj").t().contiguous()
        t = "text_model"
        out[f"{t}.embeddings.token_embedding.weight"] = sd.pop("token_embedding.weight")
        out[f"{t}.embeddings.position_embedding.weight"] = sd.pop("positional_embedding")
        out[f"{t}.final_layer_norm.weight"], out[f"{t}.final_layer_norm.bias"] = (
            sd.pop("ln_final.weight"),
            sd.pop("ln_final.bias"),
        )
        _blocks(sd, "transformer.resblocks", f"{t}.encoder.layers", config.text_config.num_hidden_layers, out)
        out["text_projection.weight"] = sd.pop("text_projection").t().contiguous()
        out["logit_scale"] = sd.pop("logit_scale").reshape(())
    except KeyError as exc:
        raise ConvertError(
            f"The weights do not fit the open_clip config: key {exc.args[0]} is missing. Nothing was written."
        ) from None
    sd.pop("attn_mask", None)  # a non-persistent buffer in open_clip, present in some old files
    if sd:
        keys = sorted(sd)
        raise ConvertError(
            f"The weights do not fit the open_clip config: {len(keys)} keys it does not describe "
            f"({'; '.join(keys[:5])}). Nothing was written."
        )
    return out


def _weights(folder: Path) -> Path:
    for name in WEIGHTS:
        if (folder / name).is_file():
            return folder / name
    raise ConvertError(f"{folder} holds none of {', '.join(WEIGHTS)}.")


def _tokenizer(folder: Path, text_cfg: dict, notes: list[str]):
    """CLIP's BPE tokenizer from the folder's files, or None with a note saying why."""
    other = text_cfg.get("hf_tokenizer_name")
    if other:
        notes.append(f"the checkpoint uses the tokenizer '{other}', not CLIP's BPE: no tokenizer was written")
        return None
    has = (folder / "tokenizer.json").is_file() or (
        (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()
    )
    if not has:
        notes.append(
            "the folder holds no tokenizer files (tokenizer.json, or vocab.json + merges.txt of CLIP's BPE): "
            "the image tower works, zero-shot labels need the tokenizer copied into the output folder"
        )
        return None
    from transformers import AutoTokenizer, CLIPTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception:  # a folder without tokenizer_config.json: CLIP's BPE from its two files
        try:
            tok = CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
        except Exception as exc:
            notes.append(f"the tokenizer files could not be read ({str(exc)[:200]}): no tokenizer was written")
            return None
    return tok


def convert_open_clip(folder: str | Path, out: str | Path, *, overwrite: bool = False) -> OpenClipReport:
    """Convert the open_clip folder ``folder`` into an HF CLIP folder ``out`` (module docstring)."""
    folder, out = Path(folder), Path(out)
    if not folder.is_dir():
        raise ConvertError(f"--checkpoint {folder} is not a folder: give the open_clip folder (with {CONFIG}).")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConvertError(f"{out} exists and is not empty; choose another --out.")
    data = _read_config(folder)
    model_cfg = data.get("model_cfg", data)
    config = hf_clip_config(model_cfg)
    state = read_state_dict(_weights(folder))
    if "logit_bias" in state:
        raise ConvertError(
            "The weights hold a logit_bias (a SigLIP-style open_clip model): it does not map to HF CLIP."
        )
    mapped = map_open_clip(state, config)

    from transformers import CLIPModel, ViTImageProcessor

    from vitviz.zoo.convert import write_center_crop

    with torch.device("meta"):  # the config's model as shapes only: compared with the weights before it is built
        shapes = CLIPModel(config)
    _check(mapped, shapes.state_dict(), "open_clip CLIP of this config")
    model = CLIPModel(config).eval()  # now the size of the weights themselves
    model.load_state_dict(mapped, strict=True)
    notes: list[str] = []
    tok = _tokenizer(folder, model_cfg.get("text_cfg") or {}, notes)
    pre = data.get("preprocess_cfg") or {}
    size = config.vision_config.image_size
    mode = pre.get("resize_mode", "shortest")
    if mode == "longest":
        notes.append(
            "open_clip pads this model's photos to a square (resize_mode 'longest'); vitviz resizes the whole photo "
            "to the square instead, so on a photo that is not square its scores differ from open_clip's"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        mean, std = list(pre.get("mean", OPENAI_MEAN)), list(pre.get("std", OPENAI_STD))
        resample = 3 if pre.get("interpolation", "bicubic") == "bicubic" else 2
        if mode == "shortest":  # open_clip's default eval: Resize(size) of the short side, CenterCrop(size)
            write_center_crop(tmp, size, size, mean, std, resample=resample)
        else:  # "squash" (and "longest", approximated, with a note): the whole photo resized to the square
            ViTImageProcessor(
                size={"height": size, "width": size}, image_mean=mean, image_std=std, resample=resample
            ).save_pretrained(tmp)
        if tok is not None:
            tok.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return OpenClipReport(out, notes)
