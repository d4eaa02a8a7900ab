"""One adapter per model family, in a registry keyed by ``model_type``.

Each module of this package holds the adapters of one kind of architecture and
lists them in its ``FAMILIES``; adding a family touches its module, its tests and
the presets, nothing else. See ``base.Family`` for the questions an adapter answers.
"""

from __future__ import annotations

from importlib import import_module

from vitviz.errors import UnsupportedModelError
from vitviz.models.families.base import Family

__all__ = ["Family", "FAMILIES", "family_for", "supported_model_types"]

_MODULES = ("vit", "swin", "pvt", "cvt", "mobilevit", "hiera", "contrastive", "selfsupervised", "cct", "t2t", "dat")


def _import(name: str):
    try:
        return import_module(f"vitviz.models.families.{name}")
    except ModuleNotFoundError as exc:  # a zoo family not written yet; any other missing module is a bug
        if exc.name != f"vitviz.models.families.{name}":
            raise
        return None


FAMILIES: tuple[Family, ...] = tuple(f for m in _MODULES if (mod := _import(m)) for f in mod.FAMILIES)
_BY_TYPE = {t: f for f in FAMILIES for t in f.model_types}


def supported_model_types() -> tuple[str, ...]:
    return tuple(_BY_TYPE)


def family_for(config) -> Family:
    """The adapter for a ``transformers`` config, or :class:`UnsupportedModelError` naming the supported families."""
    model_type = getattr(config, "model_type", None)
    if model_type in _BY_TYPE:
        return _BY_TYPE[model_type]
    names = ", ".join(f.name for f in FAMILIES)
    raise UnsupportedModelError(
        f"'{model_type}' models are not supported: vitviz explains Vision Transformers "
        f"({names}; model types {', '.join(supported_model_types())}). "
        "Choose a supported checkpoint such as google/vit-base-patch16-224 or the bundled 'demo' model."
    )
