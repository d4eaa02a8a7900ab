"""How good an SAE is on held-out images: ``vitviz sae measure``, and ``metrics.json`` beside trained weights.

Over the tokens the SAE reads (its scope: the patch tokens of a patches-only SAE, else every token) of every
held-out image:

* **explained variance** ``1 - sum ||x - x_hat||^2 / sum ||x - mean(x)||^2`` (``mean`` over all those tokens);
* **L0**: the mean number of active features per token;
* **dead fraction**: features never active on any of those tokens; **dense fraction**: features active on more
  than 10 % of them;
* **splice cost**: the model run with the point replaced by ``x_hat`` on those tokens (the error term dropped:
  ``Edit(point, "fn", decode o encode)``) against the clean run, per image: whether the top-1 class agrees, and
  ``KL(p_clean || p_spliced)`` of the softmax over the classes (natural log), averaged over images. Models
  without class scores (a backbone, or a zero-shot model without labels) get no splice cost.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from vitviz.sae.model import SAEError, SparseAutoencoder

__all__ = ["Metrics", "DENSE", "measure", "write_metrics", "read_metrics", "METRICS_FILE"]

DENSE = 0.10  # a feature active on more than this share of tokens is dense
METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class Metrics:
    """The measures of the module docstring; ``splice_*`` None where the model gives no class scores."""

    images: int
    tokens: int
    scope: str  # "patches" or "all"
    explained_variance: float
    l0: float
    dead_fraction: float
    dense_fraction: float
    splice_top1_agreement: float | None
    splice_mean_kl: float | None
    skipped: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def _softmax_kl(clean: torch.Tensor, spliced: torch.Tensor) -> torch.Tensor:
    """``KL(softmax(clean) || softmax(spliced))`` per row ``(B,)``, natural log, in float64."""
    lp = torch.log_softmax(clean.double(), dim=-1)
    lq = torch.log_softmax(spliced.double(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(dim=-1)


def measure(
    sae: SparseAutoencoder,
    loaded,
    items: Sequence,
    *,
    size=None,
    batch: int = 16,
    progress: Callable | None = None,
) -> Metrics:
    """The measures of ``sae`` on the images of ``items`` (``evaluate`` data items) at its point."""
    from vitviz.capture.targets import NoScores, scorer_for
    from vitviz.errors import VitvizError
    from vitviz.evaluate.data import load_item
    from vitviz.sae.activations import point_layout, point_values
    from vitviz.sae.run import reconstruction_edit

    point = sae.cfg.point
    if point is None:
        raise SAEError("this SAE does not say which point it reads: load it with point=...")
    images, skipped = [], 0
    for it in items:
        try:
            images.append(load_item(it))
        except VitvizError:
            skipped += 1
    if not images:
        raise SAEError("none of the held-out images could be read")
    hw, _, n_prefix, n_patch, _ = point_layout(loaded, point, images[0], size)
    scope_ids = list(range(n_prefix, n_prefix + n_patch)) if sae.cfg.tokens == "patches" else None
    try:
        scorer = scorer_for(loaded, None) if loaded.has_classifier else None
    except NoScores:
        scorer = None
    splice = reconstruction_edit(sae, scope=scope_ids)
    n_tok, sse, sx, sxx = 0, 0.0, None, 0.0
    active = torch.zeros(sae.d_sae, dtype=torch.long)
    l0_sum = 0
    agree, kls = [], []
    for start in range(0, len(images), batch):
        imgs = images[start : start + batch]
        x, out = point_values(loaded, point, imgs, hw)
        if x.shape[-1] != sae.d_in:
            raise SAEError(f"the SAE reads {sae.d_in}-wide activations; '{loaded.name}' has {x.shape[-1]} at {point}")
        xs = x[:, scope_ids] if scope_ids is not None else x
        xs = xs.reshape(-1, xs.shape[-1]).to(sae.W_enc.device).double()  # the SAE's device (the model's may differ)
        with torch.no_grad():
            f, stats = sae.encode_with_stats(xs.float())
            x_hat = sae.decode(f, stats).double()
        sse += float((xs - x_hat).pow(2).sum())
        sx = xs.sum(dim=0) if sx is None else sx + xs.sum(dim=0)
        sxx += float(xs.pow(2).sum())
        n_tok += xs.shape[0]
        on = f > 0
        active += on.sum(dim=0).cpu()
        l0_sum += int(on.sum())
        if scorer is not None:
            clean = scorer(out).float()
            _, out2 = point_values(loaded, point, imgs, hw, edits=[splice])
            spliced = scorer(out2).float()
            agree.extend((clean.argmax(-1) == spliced.argmax(-1)).tolist())
            kls.extend(_softmax_kl(clean, spliced).tolist())
        if progress:
            progress("measure", min(start + batch, len(images)), len(images), {})
    total_var = sxx - float((sx * sx).sum()) / n_tok
    freq = active.double() / n_tok
    return Metrics(
        images=len(images),
        tokens=n_tok,
        scope="patches" if scope_ids is not None else "all",
        explained_variance=1.0 - sse / total_var if total_var > 0 else float("nan"),
        l0=l0_sum / n_tok,
        dead_fraction=float((active == 0).double().mean()),
        dense_fraction=float((freq > DENSE).double().mean()),
        splice_top1_agreement=float(np.mean(agree)) if agree else None,
        splice_mean_kl=float(np.mean(kls)) if kls else None,
        skipped=skipped,
    )


def write_metrics(folder: str | Path, metrics: dict) -> Path:
    path = Path(folder) / METRICS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


_METRIC_NUMBERS = ("images", "tokens", "explained_variance", "l0", "dead_fraction", "dense_fraction")


def read_metrics(folder: str | Path) -> dict | None:
    """``metrics.json`` beside an SAE, or None where there is none or it is not one (unreadable, not JSON, a
    measure missing or not a number, the scope not a word): a file beside a checkpoint is not trusted."""
    path = Path(folder) / METRICS_FILE
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(m, dict) or not isinstance(m.get("scope"), str):
        return None
    numbers = [m.get(k) for k in _METRIC_NUMBERS]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers):
        return None
    if not isinstance(m["images"], int) or not isinstance(m["tokens"], int):
        return None
    splice = [m.get("splice_top1_agreement"), m.get("splice_mean_kl")]
    if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in splice):
        return None
    return m
