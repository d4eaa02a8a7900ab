"""Causal analyses of one image's Run: knock-outs, head importance and its fast estimate, the logit lens, direct
logit attribution, and patching between two images (activations, attention patterns, paths).

Every analysis edits the image's clean :class:`~vitviz.capture.run.Run` at named points
(:mod:`vitviz.models.points`) through one batched engine with one progress and cancel loop
(:mod:`vitviz.causal.grid`). Modules: ``notes`` (what is defined where, the clean run),
``knockout`` (knock-outs, head importance), ``estimate`` (attribution patching of knock-outs),
``lens`` (logit lens, per-patch lens), ``attribution`` (direct logit attribution), ``patching``
(activation patching and its estimate), ``paths`` (attention-pattern and path patching),
``export`` (arrays for ``export --causal``). Definitions: docs/definitions.md#head-knock-out.
"""

from __future__ import annotations

from vitviz.causal.attribution import Attribution, direct_logit_attribution
from vitviz.causal.estimate import HeadEstimate, fast_estimate
from vitviz.causal.export import causal_arrays, patching_arrays
from vitviz.causal.knockout import HeadImportance, Knockout, capture_knocked_out, head_importance, knock_out
from vitviz.causal.lens import LogitLens, logit_lens, patch_lens, patch_lens_of_run
from vitviz.causal.notes import Cancelled, KnockoutMode, NotDefined, causal_notes, head_projections, knockable_blocks
from vitviz.causal.patching import Patching, PatchingCancelled, activation_patching
from vitviz.causal.paths import HeadPatching, HeadPatchingCancelled, path_patching, pattern_patching

__all__ = [
    "Attribution",
    "Cancelled",
    "HeadEstimate",
    "HeadImportance",
    "HeadPatching",
    "HeadPatchingCancelled",
    "Knockout",
    "KnockoutMode",
    "LogitLens",
    "NotDefined",
    "Patching",
    "PatchingCancelled",
    "activation_patching",
    "capture_knocked_out",
    "causal_arrays",
    "causal_notes",
    "direct_logit_attribution",
    "fast_estimate",
    "head_importance",
    "head_projections",
    "knock_out",
    "knockable_blocks",
    "logit_lens",
    "patch_lens",
    "patch_lens_of_run",
    "path_patching",
    "pattern_patching",
    "patching_arrays",
]
