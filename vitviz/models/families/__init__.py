"""One adapter per model family, in a registry keyed by ``model_type``.

Each module of this package holds the adapters of one kind of architecture and
lists them in its ``FAMILIES``; adding a family touches its module, its tests and
the presets, nothing else. See ``base.Family`` for the questions an adapter answers.
A family written outside vitviz joins the registry with :func:`register_family`
(docs/extending/family.md shows one end to end).
"""

from __future__ import annotations

from importlib import import_module

from vitviz.errors import UnsupportedModelError
from vitviz.models.families.base import Family

__all__ = ["Family", "FAMILIES", "family_for", "register_family", "supported_model_types"]

_MODULES = (
    "vit",
    "swin",
    "pvt",
    "cvt",
    "mobilevit",
    "hiera",
    "contrastive",
    "selfsupervised",
    "cct",
    "t2t",
    "dat",
    "hybrid",
)


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


def register_family(family: Family, *, replace: bool = False) -> None:
    """Add an adapter written outside vitviz to the registry, for every ``model_type`` it names.

    After this, :func:`family_for` (and so ``load_model``) picks ``family`` for configs of those types.
    A type vitviz already maps to another adapter is refused unless ``replace`` (so a typo cannot
    silently take over ``vit``). Registration is process-wide; register before the first load.

    Raises:
        TypeError: ``family`` is not a :class:`Family` instance.
        ValueError: it names no ``model_types``, or one that is taken (without ``replace``).
    """
    global FAMILIES
    if not isinstance(family, Family):
        raise TypeError(f"register_family takes a Family instance, got {type(family).__name__}")
    types = tuple(family.model_types)
    if not types or not all(isinstance(t, str) and t for t in types):
        raise ValueError(f"the {family.name} adapter names no model_types (the config's model_type it reads)")
    taken = [t for t in types if t in _BY_TYPE and _BY_TYPE[t] is not family]
    if taken and not replace:
        names = ", ".join(f"{t} ({_BY_TYPE[t].name})" for t in taken)
        raise ValueError(f"model types already registered: {names}; pass replace=True to take them over")
    for t in types:
        _BY_TYPE[t] = family
    kept = [f for f in (*FAMILIES, family) if any(g is f for g in _BY_TYPE.values())]  # a fully replaced one drops out
    FAMILIES = tuple(dict.fromkeys(kept))  # once each, in registration order
