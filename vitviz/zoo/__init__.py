"""Vision Transformers that ``transformers`` lacks, written from their papers: CCT, T2T-ViT, DAT, the hybrid ViT.

Each module holds one architecture as a ``transformers`` model (its own config class,
``model_type`` and ``PreTrainedModel`` subclasses) with the parameter names and shapes of
the authors' official code, so that ``save_pretrained`` / ``load_model(folder)`` and every
view work unchanged. Importing a module registers its classes with the Auto classes;
:func:`register` imports them all (``load_model`` calls it first). No remote code ever runs:
the classes are ours, and official checkpoints come in through ``python -m vitviz convert``
(:mod:`vitviz.zoo.convert`), which reads plain state dicts with ``weights_only=True``.

Each module also lists ``CONVERTERS``: official model name -> :class:`~vitviz.zoo.convert.Converter`.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

__all__ = ["ARCHS", "register", "modules"]

ARCHS = ("cct", "t2t", "dat", "hybrid")


def modules() -> list[ModuleType]:
    """The architecture modules, imported (which registers their classes with the Auto classes)."""
    found = []
    for arch in ARCHS:
        try:
            found.append(import_module(f"vitviz.zoo.{arch}"))
        except ModuleNotFoundError as exc:  # an architecture not written yet; any other missing module is a bug
            if exc.name != f"vitviz.zoo.{arch}":
                raise
    return found


def register() -> None:
    """Register every zoo architecture with ``AutoConfig`` / ``AutoModel*`` (idempotent)."""
    modules()
