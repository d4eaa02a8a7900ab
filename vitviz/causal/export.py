"""Everything causal for ``export --causal`` (and ``--patch-from``), as arrays (keys in docs/export.md)."""

from __future__ import annotations

import numpy as np
from PIL import Image

from vitviz.capture.forward import DEFAULT_BUDGET_BYTES
from vitviz.capture.targets import Target
from vitviz.causal.attribution import attribution_of_run
from vitviz.causal.grid import CancelCheck, Progress
from vitviz.causal.knockout import _importance
from vitviz.causal.lens import lens_of_run
from vitviz.causal.notes import NotDefined, causal_notes, clean_run, readout_of
from vitviz.causal.patching import Patching
from vitviz.models.load import LoadedModel

__all__ = ["causal_arrays", "patching_arrays"]


def causal_arrays(
    loaded: LoadedModel,
    image: Image.Image,
    *,
    target: Target | int | None = None,
    size: int | tuple[int, int] | None = None,
    progress: Progress | None = None,
    cancel: CancelCheck | None = None,
    budget_bytes: int = DEFAULT_BUDGET_BYTES,
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """One clean run, then every analysis defined for the model, as arrays for ``export --causal``.

    Keys: ``explained_class`` () int64; ``logit_lens`` (L + 1, C) float32; ``head_ablation`` (L, H) float32, the
    *zero* knock-out effect on ``target`` (None: the top-1); ``head_attribution`` (L, H), ``mlp_attribution``
    (L,), ``attribution_rest`` () float64. A key whose analysis is not defined is left out, and the second dict
    says why (same key). A difference target (``minus=``) explains ``logit[c] - logit[minus]`` (effects and parts
    are linear in the logits: each is the class's value minus the other's); ``logit_lens`` keeps every class.
    """
    notes = causal_notes(loaded)
    run = clean_run(loaded, image, size, budget_bytes, target)
    t = run.target(target)
    arrays: dict[str, np.ndarray] = {"explained_class": np.asarray(t.index, np.int64)}
    why: dict[str, str] = {}
    try:
        arrays["logit_lens"] = lens_of_run(run).logits
    except NotDefined as exc:
        why["logit_lens"] = str(exc)
    try:
        arrays["head_ablation"] = _importance(run, t, "zero", True, None, progress, cancel, budget_bytes).effects
    except NotDefined as exc:
        why["head_ablation"] = str(exc)
    _, problem = readout_of(run)
    parts = ("head_attribution", "mlp_attribution", "attribution_rest")
    if notes["attribution"] or not run.replayable:
        why.update(dict.fromkeys(parts, notes["attribution"] or problem or "Direct logit attribution is not defined."))
    else:
        try:
            att = attribution_of_run(run, t)
        except NotDefined as exc:
            why.update(dict.fromkeys(parts, str(exc)))
        else:
            arrays["head_attribution"] = att.heads
            arrays["mlp_attribution"] = att.mlps
            arrays["attribution_rest"] = np.asarray(att.rest, np.float64)
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
