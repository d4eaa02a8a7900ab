"""vitviz: look inside Vision Transformers.

The engine behind the app, free of any UI: load a ViT-family model
(:func:`load_model`), capture one forward pass (``vitviz.capture.run.capture``), and
analyse the record with pure functions (``vitviz.analysis.rollout.rollout``, relevance,
maps, masks, summaries). Sub-packages group modules by concern: ``vitviz.capture.run`` and
``vitviz.analysis.rollout`` are modules, not the functions inside them.
References: Dosovitskiy et al. 2020 (ViT), Abnar & Zuidema 2020 (rollout),
Chefer et al. 2021 (relevance), Caron et al. 2021 (DINO masks).
"""

from vitviz.analysis.embeddings import patch_components, position_similarity
from vitviz.analysis.maps import fuse_heads, key_map, prefix_attention, query_map
from vitviz.analysis.masks import dino_masks
from vitviz.analysis.relevance import chefer_relevance
from vitviz.analysis.rollout import rollout_matrix
from vitviz.analysis.stats import attention_entropy, mean_attention_distance
from vitviz.capture.gradients import explain_classes
from vitviz.capture.run import Capture, Prediction, capture_batch
from vitviz.data.images import load_image, read_image
from vitviz.errors import (
    BudgetError,
    CaptureError,
    ImageError,
    ModelLoadError,
    UnsupportedModelError,
    VitvizError,
)
from vitviz.models.load import LoadedModel, load_model
from vitviz.notebook import run, show

__all__ = [
    "BudgetError",
    "Capture",
    "CaptureError",
    "ImageError",
    "LoadedModel",
    "ModelLoadError",
    "Prediction",
    "UnsupportedModelError",
    "VitvizError",
    "attention_entropy",
    "capture_batch",
    "chefer_relevance",
    "dino_masks",
    "explain_classes",
    "fuse_heads",
    "key_map",
    "load_image",
    "load_model",
    "mean_attention_distance",
    "patch_components",
    "position_similarity",
    "prefix_attention",
    "query_map",
    "read_image",
    "rollout_matrix",
    "run",
    "show",
]
