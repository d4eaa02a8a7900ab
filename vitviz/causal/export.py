"""Everything causal for ``export --causal`` (and ``--patch-from``), as arrays (keys in docs/export.md)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from vitviz.capture.forward import DEFAULT_BUDGET_BYTES
from vitviz.causal.attribution import attribution_of_run
from vitviz.causal.grid import CancelCheck, Progress
from vitviz.causal.knockout import _importance
from vitviz.causal.lens import lens_of_run
from vitviz.causal.notes import NotDefined, causal_notes, clean_run, readout_of
from vitviz.causal.notes import class_index as _class_index
from vitviz.causal.patching import Patching
from vitviz.models.load import LoadedModel

__all__ = ["causal_arrays", "patching_arrays"]


def causal_arrays(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    class_index: int | None = None,
    size: int | tuple[int, int] | None = None,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
    label_embeddings: np.ndarray | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
    minus_index: int | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """One clean run, then every analysis defined for the model, as arrays for ``export --causal``.

    Keys: ``explained_class`` () int64; ``logit_lens`` (L + 1, C) float32; ``head_ablation`` (L, H) float32, the
    *zero* knock-out effect on the explained class; ``head_attribution`` (L, H), ``mlp_attribution`` (L,),
    ``attribution_rest`` () float64. A key whose analysis is not defined is left out, and the second dict says
    why (same key). ``minus_index``: explain ``logit[c] - logit[minus_index]`` instead (effects and parts are
    linear in the logits: each is the class's value minus the other's); ``logit_lens`` keeps every class.
    """
    notes = causal_notes(loaded)
    run = clean_run(loaded, image, size, budget_bytes, label_embeddings)
    c = _class_index(run.scores, class_index)
    m = None if minus_index is None else _class_index(run.scores, minus_index)
    arrays: dict[str, np.ndarray] = {"explained_class": np.asarray(c, np.int64)}
    why: dict[str, str] = {}
    try:
        arrays["logit_lens"] = lens_of_run(run).logits
    except NotDefined as exc:
        why["logit_lens"] = str(exc)
    try:
        imp = _importance(run, c, "zero", True, None, progress, cancel, budget_bytes)
        arrays["head_ablation"] = imp.effects
        if m is not None:
            clean_np = imp.clean_logits
            diff = imp.logits[..., c] - imp.logits[..., m] - (clean_np[c] - clean_np[m])
            arrays["head_ablation"] = diff.astype(np.float32)
    except NotDefined as exc:
        why["head_ablation"] = str(exc)
    _, problem = readout_of(run)
    if notes["attribution"] or not run.replayable:
        for key in ("head_attribution", "mlp_attribution", "attribution_rest"):
            why[key] = notes["attribution"] or problem or "Direct logit attribution is not defined."
    else:
        try:
            att = attribution_of_run(run, c)
        except NotDefined as exc:
            why.update(dict.fromkeys(("head_attribution", "mlp_attribution", "attribution_rest"), str(exc)))
        else:
            heads, mlps, rest = att.heads, att.mlps, att.rest
            if m is not None:
                other = attribution_of_run(run, m)
                heads, mlps, rest = heads - other.heads, mlps - other.mlps, rest - other.rest
            arrays["head_attribution"] = heads
            arrays["mlp_attribution"] = mlps
            arrays["attribution_rest"] = np.asarray(rest, np.float64)
    return arrays, why


def patching_arrays(p: Patching) -> dict[str, np.ndarray]:
    """The ``patching_*`` keys of ``export --causal --patch-from`` (only the grids that were computed)."""
    arrays = {
        "patching_class": np.asarray(p.target.index, np.int64),
        "patching_clean_logit": np.asarray(p.clean, np.float32),
        "patching_source_logit": np.asarray(p.source, np.float32),
    }
    for key, value in (
        ("patching_residual", p.residual),
        ("patching_heads", p.heads),
        ("patching_residual_estimate", p.residual_estimate),
        ("patching_heads_estimate", p.heads_estimate),
    ):
        if value is not None:
            arrays[key] = value.astype(np.float32)
    return arrays
