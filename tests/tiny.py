"""One tiny random-weight model per registered ``model_type``, in one place.

``TINY[model_type](folder)`` writes a tiny checkpoint of that type (safetensors, with its image
processor, and its tokenizer for two-tower models) and returns the folder. The contract test
(``tests/models/test_contract.py``) iterates the family registry and fails for a registered type
with no entry here, so a new family cannot escape it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

LABELS = {"id2label": {0: "zero", 1: "one", 2: "two"}, "label2id": {"zero": 0, "one": 1, "two": 2}}
TINY_VIT = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8
)


def _processor(folder: Path, side: int) -> None:
    from transformers import ViTImageProcessor

    ViTImageProcessor(size={"height": side, "width": side}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )


def _save(model: torch.nn.Module, folder: Path, side: int = 32) -> Path:
    model.eval().save_pretrained(folder, safe_serialization=True)
    _processor(folder, side)
    return folder


def _conftest(key: str) -> Callable[[Path], Path]:
    def save(folder: Path) -> Path:
        from conftest import save_tiny

        return save_tiny(key, folder)

    return save


def _modern(key: str) -> Callable[[Path], Path]:
    def save(folder: Path) -> Path:
        from conftest import save_modern

        return save_modern(key, folder)

    return save


def _tower(arch: str, config: str, **extra) -> Callable[[Path], Path]:
    """An image tower on its own (``clip_vision_model``, ...)."""

    def save(folder: Path) -> Path:
        import transformers as tf

        torch.manual_seed(0)
        vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, **extra)
        return _save(getattr(tf, arch)(getattr(tf, config)(**vision)), folder, extra.get("image_size", 32))

    return save


def _selfsupervised(key: str) -> Callable[[Path], Path]:
    def save(folder: Path) -> Path:
        from models.families.test_selfsupervised import _save as save_ss

        return save_ss(key, folder)

    return save


def _zoo(key: str) -> Callable[[Path], Path]:
    def save(folder: Path) -> Path:
        if key == "t2t":
            from vitviz.zoo.t2t import T2TViTConfig, T2TViTForImageClassification

            torch.manual_seed(0)
            config = T2TViTConfig(
                tokens_type="transformer",
                image_size=48,  # soft splits: 12 x 12, 6 x 6, then 3 x 3 backbone tokens
                embed_dim=16,
                depth=2,
                num_heads=2,
                mlp_ratio=2.0,
                token_dim=8,
                **LABELS,
            )
            return _save(T2TViTForImageClassification(config), folder, 48)
        from models.test_contract import _save_zoo

        _save_zoo(key, folder)
        return folder

    return save


TINY: dict[str, Callable[[Path], Path]] = {
    "vit": _conftest("vit"),
    "deit": _conftest("deit"),
    "dinov2": _conftest("dinov2"),
    "dinov2_with_registers": _conftest("dinov2_registers"),
    "beit": _conftest("beit"),
    "swin": _conftest("swin"),
    "swinv2": _conftest("swinv2"),
    "pvt": _conftest("pvt"),
    "pvt_v2": _conftest("pvt_v2"),
    "cvt": _conftest("cvt"),
    "mobilevit": _conftest("mobilevit"),
    "mobilevitv2": _conftest("mobilevitv2"),
    "hiera": _conftest("hiera"),
    "clip": _modern("clip"),
    "clip_vision_model": _tower("CLIPVisionModel", "CLIPVisionConfig", image_size=32, patch_size=8),
    "siglip": _modern("siglip"),
    "siglip_vision_model": _tower("SiglipVisionModel", "SiglipVisionConfig", image_size=32, patch_size=8),
    "siglip2": _modern("siglip2"),
    "siglip2_vision_model": _tower("Siglip2VisionModel", "Siglip2VisionConfig", patch_size=4, num_patches=64),
    "dinov3_vit": _modern("dinov3"),
    "vit_mae": _selfsupervised("mae"),
    "ijepa": _selfsupervised("ijepa"),
    "aimv2_vision_model": _selfsupervised("aimv2_vision"),
    "aimv2": _selfsupervised("aimv2"),
    "data2vec-vision": _selfsupervised("data2vec"),
    "vit_msn": _selfsupervised("msn"),
    "cct": _zoo("cct"),
    "t2t": _zoo("t2t"),
    "dat": _zoo("dat"),
    "hybrid_vit": _zoo("hybrid"),
}
