"""What a config will cost, known before anything is built: the model on PyTorch's ``meta`` device, and the
checkpoint's tensors from their safetensors headers.

A config decides how much memory loading allocates; its weights file does not. A Swin config
with ``mlp_ratio`` 20000 beside the weights of a tiny Swin passed every check and grew past
3.5 GB before the load found the weights missing. :func:`footprint` builds the model the
config describes under ``torch.device("meta")`` (shapes only, no memory; the way
``transformers`` itself starts a load) and counts its parameters and buffers, for every family
alike, whatever fields its config uses. :func:`checkpoint_elements` reads how many values the
checkpoint holds from its safetensors headers (names, dtypes and shapes, checked against the
file's size, without reading a tensor). :func:`footprint_problem` compares the two, and the
bytes with a limit: a config promising more than 1 % more parameters than its weights hold would
be refused after loading anyway (:func:`vitviz.models.load._refuse_incomplete`), so it is refused
before.

The checkpoint's names are not compared with the model's: ``transformers`` 5 renames keys
while loading (``attention.attention.query`` -> ``attention.q_proj``), so only counts are.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from vitviz.safetensors_header import HeaderError, read_header

__all__ = [
    "Footprint",
    "MAX_MISSING_SHARE",
    "footprint",
    "checkpoint_elements",
    "footprint_problem",
]

MAX_MISSING_SHARE = 0.01  # of the parameters: what load_model lets a checkpoint leave out (heads, poolers)


@dataclass(frozen=True)
class Footprint:
    """A model's size from its config: ``parameters`` (values, tied ones once) and ``nbytes`` (parameters and
    buffers at the dtype it is loaded in; integer buffers at their own)."""

    parameters: int
    nbytes: int


def footprint(model_class, config, dtype: torch.dtype = torch.float32) -> Footprint:
    """Build ``model_class`` from ``config`` on the meta device and count what it would hold.

    Args:
        model_class: a ``transformers`` model or Auto class, or any ``nn.Module`` class taking the config.
        config: its config object.
        dtype: the dtype the weights are loaded in (floating parameters and buffers take its size).

    Raises:
        whatever building the model raises for this config (the caller turns it into a message).
    """
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        # a model class's _from_config; an Auto class (a config naming no architecture) has from_config only
        build = getattr(model_class, "_from_config", None) or getattr(model_class, "from_config", None) or model_class
        model = build(config)
    size = torch.empty((), dtype=dtype, device="meta").element_size()
    parameters = sum(int(p.numel()) for p in model.parameters())
    nbytes = parameters * size
    for b in model.buffers():
        nbytes += int(b.numel()) * (size if b.is_floating_point() else b.element_size())
    return Footprint(parameters=parameters, nbytes=nbytes)


class _BadHeader(ValueError):
    pass


def _header_elements(path: Path) -> int:
    """Values the tensors of one safetensors file hold, from its header; each entry's span checked against its
    shape and the file's size, so a header cannot claim more than the file holds."""
    why = {
        "length": "its header length does not fit the file",
        "json": "its header is not JSON",
        "table": "its header is not a table of tensors",
    }
    try:
        entries, _ = read_header(path)
    except HeaderError as exc:
        if exc.kind == "entry":
            raise _BadHeader(f"{path.name}: the entry of {exc.name[:80]} cannot be read") from None
        if exc.kind in ("span", "outside"):
            raise _BadHeader(f"{path.name}: {exc.name[:80]} does not fit the file") from None
        raise _BadHeader(f"{path.name}: {why[exc.kind]}") from None
    return sum(e.count for e in entries)


def checkpoint_elements(files: Iterable[str | Path]) -> int:
    """Values held by the tensors of safetensors ``files`` (a checkpoint's shards), from their headers alone.

    Raises:
        ValueError: a header that cannot be read, or that claims more than its file holds.
    """
    return sum(_header_elements(Path(f)) for f in files)


def footprint_problem(
    need: Footprint, held: int | None, *, max_bytes: int | None = None, max_missing: float = MAX_MISSING_SHARE
) -> str | None:
    """Why a model of ``need`` is not built (None when it may be), in words that follow "the config".

    ``held``: values in the checkpoint (None when unknown: pickle weights); ``max_bytes``: the memory the model may
    take (None: no limit).
    """
    if max_bytes is not None and need.nbytes > max_bytes:
        return (
            f"asks for a model of {need.nbytes / 2**30:,.2f} GiB ({need.parameters:,} parameters), more than the "
            f"{max_bytes / 2**30:,.2f} GiB allowed"
        )
    if held is not None and need.parameters - held > max_missing * need.parameters:
        return (
            f"asks for {need.parameters:,} parameters, and its weights hold {held:,} values: the missing ones would "
            "be random"
        )
    return None
