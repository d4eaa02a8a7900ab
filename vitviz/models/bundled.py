"""Where the bundled demo models live.

Each bundled model is a folder written by ``save_pretrained`` (safetensors) under
``vitviz/assets``, loaded by a short name like any hub checkpoint. Training and scoring
them is :mod:`vitviz.demo`'s (which sits above ``models``); this table sits here so that
:func:`vitviz.models.load.load_model` can resolve the names without importing it.
"""

from pathlib import Path

__all__ = ["ASSETS", "BUNDLED", "bundled"]

ASSETS = Path(__file__).resolve().parents[1] / "assets"
BUNDLED = {
    "demo": ASSETS / "demo-vit",  # a 4-layer ViT (vitviz.demo.vit)
    "demo-swin": ASSETS / "demo-swin",  # a 3-stage Swin (vitviz.demo.swin)
    "demo-clip": ASSETS / "demo-clip",  # a tiny CLIP with its own tokenizer (vitviz.demo.clip)
}


def bundled() -> dict[str, Path]:
    """The bundled models present in this checkout, by name."""
    return {name: path for name, path in BUNDLED.items() if (path / "config.json").is_file()}
