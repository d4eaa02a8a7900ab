"""Read an SAE from disk: SAELens folders (vitviz's own among them), ViT-Prisma's checkpoints and saev's.

Three layouts are recognised (:func:`load_sae` says which it found):

* **SAELens** (and vitviz): a folder with ``cfg.json`` and ``sae_weights.safetensors`` (``W_enc``, ``b_enc``,
  ``W_dec``, ``b_dec``; ``threshold`` for JumpReLU). Configs before SAELens 6 are read as SAELens reads them
  (``hook_point`` is ``hook_name``, ``activation_fn_str`` ``"topk"`` with ``activation_fn_kwargs.k`` a TopK SAE).
  ``normalize_activations = "expected_average_only_in"`` applies no normalisation at inference (SAELens folds the
  factor into the weights; so does vitviz's trainer). Hook names are TransformerLens' and map to vitviz points
  (``blocks.9.hook_resid_post`` is ``blocks.9.out``; :data:`vitviz.models.points.TRANSFORMER_LENS_NAMES`).
* **ViT-Prisma**: a folder with ViT-Prisma's ``config.json`` (``VisionModelSAERunnerConfig``: ``d_in``,
  ``d_sae`` or ``expansion_factor``, ``hook_point_layer`` + ``layer_subtype``, ``activation_fn_str``,
  ``normalize_activations``, default ``layer_norm``) and one ``.pt`` file (its ``weights.pt``, or a
  training checkpoint ``n_images_*.pt``), or the ``.pt`` file itself with ``config.json`` beside it. The ``.pt``
  file is read with ``torch.load(weights_only=True)``: no code in it runs. ViT-Prisma pickles its config object
  beside the state dict; that one class is read as an inert stand-in (its values are not used: ``config.json``
  is), and any other class or function in the pickle refuses the file.
* **saev**: one file (``sae.pt``, or a folder holding it) whose first line is a JSON header (``schema``,
  ``cfg``: ``d_model``, ``d_sae``, ``activation``) followed by a ``torch.save`` d state dict, read with
  ``weights_only=True``. saev encodes without subtracting ``b_dec``; its TopK keeps the k largest
  pre-activations as they are (no ReLU); its BatchTopK runs at inference as a threshold (one for every feature).
  A saev checkpoint does not name its layer: give the point.

A hub id (``owner/name``) is not fetched here: download the folder and give its path.
"""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from vitviz.models.points import TRANSFORMER_LENS_NAMES
from vitviz.sae.model import (
    CFG_FILE,
    WEIGHTS_FILE,
    SAEConfig,
    SAEError,
    SparseAutoencoder,
)

__all__ = ["load_sae", "point_from_hook_name", "check_point", "read_state", "FORMATS"]

FORMATS = ("saelens", "prisma", "saev")
MAX_HEADER_BYTES = 1 << 20  # a saev header is one JSON line; a longer first line is not one
_TL_TO_VITVIZ = {v: k for k, v in TRANSFORMER_LENS_NAMES.items()}
_LOAD_LOCK = threading.Lock()  # torch's safe_globals context is process-wide: one Prisma load at a time


def point_from_hook_name(hook: str) -> str:
    """The vitviz point of a TransformerLens / ViT-Prisma hook name: ``blocks.9.hook_resid_post`` ->
    ``blocks.9.out``; ``hook_embed`` style names and vitviz's own names pass as they are."""
    m = re.fullmatch(r"(blocks\.\d+)\.(.+)", hook.strip())
    if m is None:
        if hook.strip() in ("hook_embed", "hook_pos_embed"):
            raise SAEError(
                f"the SAE reads {hook!r}, the embedding before the position embeddings are added: vitviz has the "
                "sum only (embed.out, blocks.0.in)"
            )
        return hook.strip()
    stem, tail = m.groups()
    if tail in _TL_TO_VITVIZ:
        return f"{stem}.{_TL_TO_VITVIZ[tail]}"
    if tail in TRANSFORMER_LENS_NAMES:  # already a vitviz part
        return f"{stem}.{tail}"
    known = ", ".join(sorted(_TL_TO_VITVIZ))
    raise SAEError(f"the SAE reads {hook!r}: vitviz has no point there (it maps {known} of each block)")


def check_point(sae: SparseAutoencoder, loaded) -> None:
    """Raise :class:`SAEError` unless ``loaded`` has the SAE's point (the width is checked on a run)."""
    from vitviz.models.hooks import installed_points

    point = sae.cfg.point
    if point is None:
        raise SAEError("this SAE does not say which point it reads: give the point (e.g. blocks.2.out)")
    points = installed_points(loaded.model)
    if point not in points:
        stem = point.rsplit(".", 1)[0]
        near = [n for n in points.names() if n.startswith(stem)][:5] or [
            n for n in points.names() if n.endswith(".out")
        ][:5]
        raise SAEError(
            f"the SAE reads {point}, which '{loaded.name}' does not have (it has e.g. {', '.join(near)}): it was "
            "trained on another model"
        )


# --- the weights ------------------------------------------------------------------------------------------


def _finite(state: Mapping[str, torch.Tensor], where: str) -> None:
    for k, v in state.items():
        if not torch.isfinite(v).all():
            n = int((~torch.isfinite(v)).sum())
            raise SAEError(f"{where}: {k} holds {n} non-finite values (NaN or inf): the SAE is damaged, not loaded")


def read_state(cfg: SAEConfig, state: Mapping[str, Any], where: str) -> SparseAutoencoder:
    """An SAE of ``cfg`` with ``state`` (SAELens' names); refuses missing, unknown, misshapen or non-finite
    weights, naming them."""
    sae = SparseAutoencoder(cfg)
    want = {k: tuple(v.shape) for k, v in sae.state_dict().items()}
    got = {k: v for k, v in state.items()}
    bad = [k for k, v in got.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise SAEError(f"{where}: {', '.join(bad)} are not tensors")
    unknown = sorted(set(got) - set(want))
    if unknown:
        raise SAEError(
            f"{where}: unknown weights {', '.join(unknown)} (a {cfg.activation} SAE has {', '.join(want)}): "
            "another architecture, not loaded"
        )
    missing = sorted(set(want) - set(got))
    if missing:
        raise SAEError(
            f"{where}: missing weights {', '.join(missing)} (a {cfg.activation} SAE needs {', '.join(want)})"
        )
    for k, shape in want.items():
        if tuple(got[k].shape) != shape:
            raise SAEError(
                f"{where}: {k} has shape {tuple(got[k].shape)}, the config (d_in {cfg.d_in}, d_sae {cfg.d_sae}) "
                f"needs {shape}"
            )
    floats = {k: v.detach().to(torch.float32) for k, v in got.items()}
    _finite(floats, where)
    sae.load_state_dict(floats)
    sae.eval()
    for p in sae.parameters():
        p.requires_grad_(False)
    return sae


# --- SAELens ----------------------------------------------------------------------------------------------


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SAEError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise SAEError(f"{path} is not a JSON object")
    return data


def _int(cfg: Mapping, key: str, where: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SAEError(f"{where}: {key} must be a positive integer, got {v!r}")
    return v


def _saelens_config(raw: Mapping[str, Any], where: str, point: str | None) -> SAEConfig:
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    notes: list[str] = []
    # Before SAELens 6: hook_point -> hook_name, activation_fn_str -> activation_fn (SAELens' handle_pre_6_0_config)
    hook = meta.get("hook_name") or raw.get("hook_name") or raw.get("hook_point")
    head = meta.get("hook_head_index", raw.get("hook_head_index", raw.get("hook_point_head_index")))
    if head is not None:
        raise SAEError(f"{where}: the SAE reads one head ({head}) of {hook}: vitviz reads whole points only")
    arch = raw.get("architecture", "standard")
    act_fn = raw.get("activation_fn", raw.get("activation_fn_str", "relu"))
    k = raw.get("k")
    kwargs = raw.get("activation_fn_kwargs") or {}
    if arch == "standard" and act_fn == "topk":
        arch, k = "topk", kwargs.get("k", k)
    if arch == "standard":
        if act_fn not in ("relu", None):
            raise SAEError(f"{where}: activation {act_fn!r} is not one vitviz computes (relu, topk, jumprelu)")
        activation = "relu"
    elif arch in ("topk", "jumprelu"):
        activation = arch
    else:
        raise SAEError(
            f"{where}: architecture {arch!r} is not one vitviz computes (standard, topk, jumprelu); not loaded"
        )
    if raw.get("rescale_acts_by_decoder_norm"):
        raise SAEError(f"{where}: rescale_acts_by_decoder_norm is not supported by vitviz yet; not loaded")
    if raw.get("finetuning_scaling_factor"):
        raise SAEError(f"{where}: a finetuning scaling factor is not supported by vitviz; not loaded")
    if raw.get("reshape_activations", "none") not in ("none", "hook_z"):
        raise SAEError(f"{where}: reshape_activations {raw.get('reshape_activations')!r} is not supported")
    norm = raw.get("normalize_activations", "none")
    if isinstance(norm, bool):  # before SAELens 6: True meant expected_average_only_in
        norm = "expected_average_only_in" if norm else "none"
    if norm is None:
        norm = "none"
    if norm == "expected_average_only_in":
        notes.append(
            "normalize_activations is expected_average_only_in: no normalisation at inference (the factor is in "
            "the weights), as SAELens reads it"
        )
        norm = "none"
    vitviz_point = raw.get("vitviz_point")
    if point is None:
        if vitviz_point:
            point = str(vitviz_point)
        elif hook:
            point = point_from_hook_name(str(hook))
    tokens = raw.get("vitviz_tokens")
    return SAEConfig(
        d_in=_int(raw, "d_in", where),
        d_sae=_int(raw, "d_sae", where),
        activation=activation,
        k=k if activation == "topk" else None,
        topk_relu=bool(raw.get("vitviz_topk_relu", True)),
        apply_b_dec_to_input=bool(raw.get("apply_b_dec_to_input", True)),
        normalize_activations=norm,
        point=point,
        model=raw.get("vitviz_model") or meta.get("model_name") or raw.get("model_name"),
        tokens=tokens if tokens in ("patches", "all") else None,
        source="vitviz" if "vitviz_point" in raw else "saelens",
        hook_name=None if hook is None else str(hook),
        notes=tuple(notes),
        training=dict(raw.get("vitviz_training") or {}),
    )


def _load_saelens(folder: Path, point: str | None) -> SparseAutoencoder:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    raw = _read_json(folder / CFG_FILE)
    cfg = _saelens_config(raw, str(folder), point)
    try:
        state = load_file(str(folder / WEIGHTS_FILE))
    except (SafetensorError, OSError) as exc:
        raise SAEError(f"cannot read {folder / WEIGHTS_FILE}: {exc}") from None
    scaling = state.pop("scaling_factor", None)  # SAELens dropped an all-ones one; anything else changes the SAE
    if scaling is not None and not torch.all(scaling == 1):
        raise SAEError(f"{folder}: a scaling_factor other than 1 (a finetuning scale) is not supported; not loaded")
    return read_state(cfg, state, str(folder))


# --- ViT-Prisma ---------------------------------------------------------------------------------------------


class _InertConfig:
    """Stands in for ViT-Prisma's pickled config objects: holds the values the pickle sets, runs nothing."""

    def __setstate__(self, state: Any) -> None:
        self.__dict__["_state"] = state


_PRISMA_PICKLED = (
    "vit_prisma.sae.config.VisionModelSAERunnerConfig",
    "vit_prisma.configs.HookedViTConfig.HookedViTConfig",
)


def _weights_only(data: bytes | Path, where: str, *, allow_prisma_config: bool = False) -> Any:
    """``torch.load(weights_only=True)``; a pickle that needs any other class or function is refused."""
    import pickle

    src = io.BytesIO(data) if isinstance(data, bytes) else str(data)
    try:
        if not allow_prisma_config:
            return torch.load(src, map_location="cpu", weights_only=True)
        with _LOAD_LOCK, torch.serialization.safe_globals([(_InertConfig, name) for name in _PRISMA_PICKLED]):
            return torch.load(src, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f" ({found.group(1)})" if found else ""
        raise SAEError(
            f"{where} is a pickle that needs code to load{what}: vitviz reads tensors only "
            "(torch.load with weights_only=True) and never runs code from a checkpoint; not loaded"
        ) from None
    except (RuntimeError, OSError, EOFError, ValueError) as exc:
        raise SAEError(f"cannot read {where}: {exc}") from None


def _prisma_config(raw: Mapping[str, Any], where: str, point: str | None) -> SAEConfig:
    notes: list[str] = []
    arch = raw.get("architecture", "standard")
    if arch != "standard":
        raise SAEError(f"{where}: ViT-Prisma architecture {arch!r} is not supported (standard only); not loaded")
    d_in = _int(raw, "d_in", where)
    d_sae = raw.get("d_sae")
    if d_sae is None and isinstance(raw.get("expansion_factor"), int):
        d_sae = d_in * raw["expansion_factor"]
    d_sae = _int({"d_sae": d_sae}, "d_sae", where)
    act = raw.get("activation_fn_str", "relu")
    kwargs = raw.get("activation_fn_kwargs") or {}
    if act == "topk":
        activation, k = "topk", kwargs.get("k")
    elif act == "relu":
        activation, k = "relu", None
    else:
        raise SAEError(f"{where}: activation {act!r} is not one vitviz computes (relu, topk); not loaded")
    norm = raw.get("normalize_activations")
    if norm is None:
        norm = "layer_norm"  # ViT-Prisma's default when the config does not say
        notes.append("the config names no normalisation: ViT-Prisma's default, layer_norm, applied")
    if norm not in ("none", "layer_norm", "constant_norm_rescale"):
        raise SAEError(f"{where}: normalize_activations {norm!r} is not supported; not loaded")
    hook = raw.get("hook_point")
    if hook is None and "hook_point_layer" in raw:
        layer = raw["hook_point_layer"]
        if isinstance(layer, list) and len(layer) == 1:
            layer = layer[0]
        hook = f"blocks.{layer}.{raw.get('layer_subtype', 'hook_resid_post')}"
    if raw.get("hook_point_head_index") is not None:
        raise SAEError(f"{where}: the SAE reads one head of {hook}: vitviz reads whole points only")
    if point is None and hook is not None:
        point = point_from_hook_name(str(hook))
    tokens = None
    if raw.get("cls_token_only"):
        notes.append("trained on the CLS token only")
    elif raw.get("use_patches_only"):
        tokens = "patches"
    elif "use_patches_only" in raw:
        tokens = "all"
    return SAEConfig(
        d_in=d_in,
        d_sae=d_sae,
        activation=activation,
        k=k,
        apply_b_dec_to_input=True,  # ViT-Prisma always subtracts b_dec before encoding
        normalize_activations=norm,
        point=point,
        model=raw.get("model_name"),
        tokens=tokens,
        source="prisma",
        hook_name=None if hook is None else str(hook),
        notes=tuple(notes),
    )


def _load_prisma(weights: Path, point: str | None) -> SparseAutoencoder:
    config = weights.parent / "config.json"
    if not config.is_file():
        raise SAEError(f"{weights}: ViT-Prisma's config.json is not beside it; not loaded")
    cfg = _prisma_config(_read_json(config), str(config), point)
    obj = _weights_only(weights, str(weights), allow_prisma_config=True)
    if isinstance(obj, Mapping) and "state_dict" in obj:
        obj = obj["state_dict"]
    if not isinstance(obj, Mapping):
        raise SAEError(f"{weights} holds a {type(obj).__name__}, not a state dict; not loaded")
    return read_state(cfg, dict(obj), str(weights))


# --- saev -------------------------------------------------------------------------------------------------


def _saev_header(path: Path) -> tuple[dict, bytes] | None:
    """(header, the rest) when ``path`` starts with a JSON line, else None."""
    try:
        with path.open("rb") as fh:
            first = fh.readline(MAX_HEADER_BYTES)
            if not first.lstrip().startswith(b"{") or not first.endswith(b"\n"):
                return None
            rest = fh.read()
    except OSError as exc:
        raise SAEError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        header = json.loads(first)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return (header, rest) if isinstance(header, dict) else None


def _saev_config(header: Mapping[str, Any], where: str, point: str | None) -> tuple[SAEConfig, str]:
    """The config and saev's activation class (``Relu``, ``TopK``, ``BatchTopK``)."""
    if "schema" not in header:  # before saev's schemas: the config itself, ReLU
        cfg, cls, params = dict(header), "Relu", {}
        cfg.setdefault("d_model", cfg.get("d_vit"))
    else:
        if header["schema"] not in (1, 2, 3, 4, 5):
            raise SAEError(f"{where}: saev schema {header['schema']!r} is newer than vitviz reads (1-5); not loaded")
        cfg = dict(header.get("cfg") or {})
        act = cfg.get("activation")
        if isinstance(act, Mapping):
            cls, params = act.get("cls"), dict(act.get("params") or {})
        else:  # schema 1, first form: the activation's class is the header's "cls"
            cls, params = header.get("cls", "Relu"), {"top_k": cfg.get("top_k", 32)}
    d_model = cfg.get("d_model")
    if d_model is None and "exp_factor" in cfg:
        raise SAEError(f"{where}: the header gives no d_model; not loaded")
    d_sae = cfg.get("d_sae")
    if d_sae is None and isinstance(cfg.get("exp_factor"), int) and isinstance(d_model, int):
        d_sae = d_model * cfg["exp_factor"]
    if cls not in ("Relu", "TopK", "BatchTopK"):
        raise SAEError(f"{where}: saev activation {cls!r} is not one vitviz computes (Relu, TopK, BatchTopK)")
    if point is None:
        raise SAEError(
            f"{where} is a saev checkpoint, which does not say which layer it reads: give the point "
            "(e.g. point='blocks.10.out', --point blocks.10.out)"
        )
    notes = ["saev: b_dec is not subtracted before encoding"]
    if cls == "TopK":
        activation, k, relu = "topk", int(params.get("top_k", 32)), False
        notes.append("saev's TopK keeps the k largest pre-activations without a ReLU")
    elif cls == "BatchTopK":
        activation, k, relu = "jumprelu", None, True
        notes.append("saev's BatchTopK runs at inference as one threshold for every feature")
    else:
        activation, k, relu = "relu", None, True
    config = SAEConfig(
        d_in=_int({"d_model": d_model}, "d_model", where),
        d_sae=_int({"d_sae": d_sae}, "d_sae", where),
        activation=activation,
        k=k,
        topk_relu=relu,
        apply_b_dec_to_input=False,
        point=point,
        source="saev",
        notes=tuple(notes),
    )
    return config, cls


def _load_saev(path: Path, header: dict, rest: bytes, point: str | None) -> SparseAutoencoder:
    cfg, cls = _saev_config(header, str(path), point)
    state = _weights_only(rest, str(path))
    if not isinstance(state, Mapping):
        raise SAEError(f"{path} holds a {type(state).__name__}, not a state dict; not loaded")
    state = dict(state)
    if cls == "BatchTopK":
        t = state.pop("activation.threshold", None)
        if not isinstance(t, torch.Tensor) or t.numel() != 1:
            raise SAEError(f"{path}: a BatchTopK checkpoint needs its activation.threshold (one number)")
        # saev: x where x > theta; theta <= 0 means ReLU. A JumpReLU at max(theta, 0) for every feature is the same.
        state["threshold"] = torch.full((cfg.d_sae,), max(float(t), 0.0))
    return read_state(cfg, state, str(path))


# --- the entry point --------------------------------------------------------------------------------------


def _looks_like_hub_id(text: str) -> bool:
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+(/[\w.-]+)*", text)) and not text.startswith(".")


def load_sae(path: str | Path, *, point: str | None = None, loaded=None) -> SparseAutoencoder:
    """The SAE at ``path`` (a folder or a file; module docstring for the layouts), in eval mode, weights frozen.

    ``point``: the vitviz point it reads, where the checkpoint does not say (saev) or to override it (a
    TransformerLens hook name is mapped). ``loaded``: a :class:`~vitviz.models.load.LoadedModel` whose points
    must include the SAE's. Raises :class:`~vitviz.sae.model.SAEError` saying what is wrong.
    """
    if point is not None:
        point = point_from_hook_name(point)
    p = Path(path)
    if not p.exists():
        if _looks_like_hub_id(str(path)):
            raise SAEError(
                f"'{path}' is not a folder here, and vitviz does not fetch SAEs from the Hugging Face Hub: download "
                f"it first (huggingface-cli download {path} --local-dir DIR) and give DIR"
            )
        raise SAEError(f"'{path}' does not exist: give an SAE folder (cfg.json + sae_weights.safetensors)")
    sae = _load_path(p, point)
    if loaded is not None:
        check_point(sae, loaded)
    return sae


def _load_path(p: Path, point: str | None) -> SparseAutoencoder:
    if p.is_file():
        if p.name == WEIGHTS_FILE or p.name == CFG_FILE:
            return _load_path(p.parent, point)
        found = _saev_header(p)
        if found is not None:
            return _load_saev(p, *found, point)
        if (p.parent / "config.json").is_file():
            return _load_prisma(p, point)
        raise SAEError(
            f"{p}: neither a saev checkpoint (a JSON header line) nor a ViT-Prisma one (config.json beside it)"
        )
    if (p / CFG_FILE).is_file() and (p / WEIGHTS_FILE).is_file():
        return _load_saelens(p, point)
    if (p / "sae.pt").is_file():
        return _load_path(p / "sae.pt", point)
    pts = sorted(f for f in p.iterdir() if f.suffix == ".pt" and f.is_file())
    if (p / "config.json").is_file() and pts:
        if len(pts) > 1:
            names = ", ".join(f.name for f in pts[:6])
            raise SAEError(f"{p} holds several ViT-Prisma checkpoints ({names}): give the .pt file itself")
        return _load_prisma(pts[0], point)
    raise SAEError(
        f"{p} holds no SAE vitviz reads: cfg.json + sae_weights.safetensors (SAELens, vitviz), config.json + a .pt "
        "file (ViT-Prisma), or sae.pt (saev)"
    )
