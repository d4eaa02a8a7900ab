"""vitviz: look inside Vision Transformers.

The engine behind the app, free of any UI: load a ViT-family model
(:func:`load_model`), capture one forward pass (``vitviz.capture.forward.capture``), and
analyse the record with pure functions (``vitviz.analysis.rollout.rollout``, relevance,
maps, masks, summaries). Sub-packages group modules by concern: ``vitviz.capture.forward`` and
``vitviz.analysis.rollout`` are modules, not the functions inside them.
References: Dosovitskiy et al. 2020 (ViT), Abnar & Zuidema 2020 (rollout),
Chefer et al. 2021 (relevance), Caron et al. 2021 (DINO masks).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> the module that defines it. Imported on first use (PEP 562), so ``import vitviz``
# stays light (no torch): ``vitviz.analysis``, ``vitviz.figures`` and a saved record need none of it.
_LAZY = {
    "BudgetError": "vitviz.errors",
    "Capture": "vitviz.record",
    "CaptureError": "vitviz.errors",
    "Edit": "vitviz.models.points",
    "ImageError": "vitviz.errors",
    "LoadedModel": "vitviz.models.load",
    "ModelLoadError": "vitviz.errors",
    "Prediction": "vitviz.record",
    "Run": "vitviz.capture.run",
    "Target": "vitviz.capture.targets",
    "UnsupportedModelError": "vitviz.errors",
    "VitvizError": "vitviz.errors",
    "activation_patching": "vitviz.causal",
    "attention_entropy": "vitviz.analysis.stats",
    "capture_batch": "vitviz.capture.forward",
    "chefer_relevance": "vitviz.analysis.relevance",
    "dino_masks": "vitviz.analysis.masks",
    "direct_logit_attribution": "vitviz.causal",
    "explain": "vitviz.methods",
    "explain_classes": "vitviz.capture.gradients",
    "fast_estimate": "vitviz.causal",
    "fuse_heads": "vitviz.analysis.maps",
    "get_run": "vitviz.capture.run",
    "head_importance": "vitviz.causal",
    "key_map": "vitviz.analysis.maps",
    "knock_out": "vitviz.causal",
    "load_image": "vitviz.data.images",
    "load_model": "vitviz.models.load",
    "logit_lens": "vitviz.causal",
    "mean_attention_distance": "vitviz.analysis.stats",
    "patch_components": "vitviz.analysis.embeddings",
    "patch_lens": "vitviz.causal",
    "path_patching": "vitviz.causal",
    "pattern_patching": "vitviz.causal",
    "position_similarity": "vitviz.analysis.embeddings",
    "prefix_attention": "vitviz.analysis.maps",
    "query_map": "vitviz.analysis.maps",
    "read_image": "vitviz.data.images",
    "rollout_matrix": "vitviz.analysis.rollout",
    "run": "vitviz.notebook",
    "show": "vitviz.notebook",
}

if TYPE_CHECKING:  # for type checkers and IDEs only; at run time the names come from __getattr__
    from vitviz.analysis.embeddings import patch_components, position_similarity
    from vitviz.analysis.maps import fuse_heads, key_map, prefix_attention, query_map
    from vitviz.analysis.masks import dino_masks
    from vitviz.analysis.relevance import chefer_relevance
    from vitviz.analysis.rollout import rollout_matrix
    from vitviz.analysis.stats import attention_entropy, mean_attention_distance
    from vitviz.capture.forward import capture_batch
    from vitviz.capture.gradients import explain_classes
    from vitviz.capture.run import Run, get_run
    from vitviz.capture.targets import Target
    from vitviz.causal import (
        activation_patching,
        direct_logit_attribution,
        fast_estimate,
        head_importance,
        knock_out,
        logit_lens,
        patch_lens,
        path_patching,
        pattern_patching,
    )
    from vitviz.data.images import load_image, read_image
    from vitviz.errors import (
        BudgetError,
        CaptureError,
        ImageError,
        ModelLoadError,
        UnsupportedModelError,
        VitvizError,
    )
    from vitviz.methods import explain
    from vitviz.models.load import LoadedModel, load_model
    from vitviz.models.points import Edit
    from vitviz.notebook import run, show
    from vitviz.record import Capture, Prediction

__all__ = [
    "BudgetError",
    "Capture",
    "CaptureError",
    "Edit",
    "ImageError",
    "LoadedModel",
    "ModelLoadError",
    "Prediction",
    "Run",
    "Target",
    "UnsupportedModelError",
    "VitvizError",
    "activation_patching",
    "attention_entropy",
    "capture_batch",
    "chefer_relevance",
    "dino_masks",
    "direct_logit_attribution",
    "explain",
    "explain_classes",
    "fast_estimate",
    "fuse_heads",
    "get_run",
    "head_importance",
    "key_map",
    "knock_out",
    "load_image",
    "load_model",
    "logit_lens",
    "mean_attention_distance",
    "patch_components",
    "patch_lens",
    "path_patching",
    "pattern_patching",
    "position_similarity",
    "prefix_attention",
    "query_map",
    "read_image",
    "rollout_matrix",
    "run",
    "show",
]


def _version() -> str:
    """The installed distribution's version (its metadata: one source, ``pyproject.toml``'s at build time); from
    a source checkout that is not installed, ``pyproject.toml``'s own; ``"0+unknown"`` when neither is found."""
    from importlib import metadata

    try:
        return metadata.version("vitviz")
    except metadata.PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    try:
        with (Path(__file__).resolve().parents[1] / "pyproject.toml").open("rb") as f:
            project = tomllib.load(f).get("project", {})
    except (OSError, ValueError):
        return "0+unknown"
    return str(project.get("version", "0+unknown")) if project.get("name") == "vitviz" else "0+unknown"


def __getattr__(name: str) -> Any:
    """Import the module behind a public name on first use, and keep the name here (``__version__`` too)."""
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vitviz' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "__version__"})
