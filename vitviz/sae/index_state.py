"""The running state of a feature index (:mod:`vitviz.sae.index`), shared by its local and Ray engines: the
per-feature counts and top-k merge, one batch's encoding, the SAE's digest and the index's error."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch

from vitviz.sae.model import SAEError, SparseAutoencoder

__all__ = ["HIST_EDGES", "FEATURE_CHUNK", "FeatureIndexError", "sae_digest", "IndexState", "encode_batch"]

# Histogram bins of active values, shared by every feature: 64 bins log-spaced from 1e-4 to 1e4 (8 per decade);
# values below the first edge count in the first bin, above the last in the last.
HIST_EDGES = np.logspace(-4.0, 4.0, 65)
FEATURE_CHUNK = 4096  # features merged at once (the sort's memory: (top_k + batch tokens) x chunk)


class FeatureIndexError(SAEError):
    """A feature index that cannot be built or read, or belongs to another SAE, model or point."""


def sae_digest(sae: SparseAutoencoder) -> str:
    """SHA-256 (hex) of the SAE's weights: each tensor's name, shape and float32 bytes, names sorted."""
    h = hashlib.sha256()
    for name, t in sorted(sae.state().items()):
        h.update(f"{name}:{tuple(t.shape)};".encode())
        h.update(t.cpu().numpy().tobytes())
    return h.hexdigest()


class IndexState:
    """Running per-feature state: active counts, sums, histogram counts and the ``top_k`` best so far.

    A token's *position* is ``item * n_scope + t``: ``item`` its image's place in the data set's list, ``t`` its
    place among the tokens in scope. The best are kept in the order (activation descending, position ascending),
    so the result is the same whatever order batches arrive in (the Ray engine's) and whatever their size."""

    def __init__(self, d_sae: int, top_k: int) -> None:
        self.d_sae, self.k = int(d_sae), int(top_k)
        self.tokens = 0
        self.active = torch.zeros(d_sae, dtype=torch.int64)
        self.total = torch.zeros(d_sae, dtype=torch.float64)
        self.hist = torch.zeros(d_sae * (len(HIST_EDGES) - 1), dtype=torch.int64)
        self.top_val = torch.zeros(self.k, d_sae, dtype=torch.float32)
        self.top_pos = torch.full((self.k, d_sae), -1, dtype=torch.int64)
        self._inner = torch.as_tensor(HIST_EDGES[1:-1], dtype=torch.float32)

    def add(self, f: torch.Tensor, positions: torch.Tensor) -> None:
        """Merge feature activations ``f`` ``(N, d_sae)`` of the tokens at ``positions`` ``(N,)``."""
        f = f.detach().float().cpu()
        n = f.shape[0]
        if n == 0:
            return
        on = f > 0
        self.tokens += n
        self.active += on.sum(dim=0)
        self.total += f.sum(dim=0, dtype=torch.float64)
        rows, cols = on.nonzero(as_tuple=True)
        if rows.numel():
            bins = torch.bucketize(f[rows, cols], self._inner, right=True)
            self.hist.index_add_(0, cols * (len(HIST_EDGES) - 1) + bins, torch.ones_like(bins))
        self._merge_top(f, positions.to(torch.int64)[:, None].expand(n, self.d_sae))

    def merge(self, other: IndexState) -> None:
        """Add another state's counts and merge its best (a Ray actor's partial state)."""
        self.tokens += other.tokens
        self.active += other.active
        self.total += other.total
        self.hist += other.hist
        self._merge_top(other.top_val, other.top_pos)

    def _merge_top(self, vals: torch.Tensor, poss: torch.Tensor) -> None:
        for c0 in range(0, self.d_sae, FEATURE_CHUNK):
            c1 = min(c0 + FEATURE_CHUNK, self.d_sae)
            v = torch.cat([self.top_val[:, c0:c1], vals[:, c0:c1]])
            p = torch.cat([self.top_pos[:, c0:c1], poss[:, c0:c1]])
            by_pos = torch.sort(p, dim=0, stable=True).indices  # positions ascending, then (stable) values descending
            v, p = torch.gather(v, 0, by_pos), torch.gather(p, 0, by_pos)
            order = torch.sort(v, dim=0, descending=True, stable=True).indices[: self.k]
            self.top_val[:, c0:c1] = torch.gather(v, 0, order)
            self.top_pos[:, c0:c1] = torch.gather(p, 0, order)

    # plain bytes, for a Ray actor's answer
    _ARRAYS = (("active", torch.int64), ("total", torch.float64), ("hist", torch.int64))

    def to_row(self) -> dict:
        row = {"tokens": self.tokens}
        for name, _ in self._ARRAYS:
            row[name] = getattr(self, name).numpy().tobytes()
        row["top_val"] = self.top_val.numpy().tobytes()
        row["top_pos"] = self.top_pos.numpy().tobytes()
        return row

    @classmethod
    def from_row(cls, row: dict, d_sae: int, top_k: int) -> IndexState:
        st = cls(d_sae, top_k)
        st.tokens = int(row["tokens"])
        for name, dtype in cls._ARRAYS:
            arr = np.frombuffer(row[name], dtype=torch.empty(0, dtype=dtype).numpy().dtype).copy()
            setattr(st, name, torch.from_numpy(arr))
        st.top_val = torch.from_numpy(np.frombuffer(row["top_val"], np.float32).copy().reshape(top_k, d_sae))
        st.top_pos = torch.from_numpy(np.frombuffer(row["top_pos"], np.int64).copy().reshape(top_k, d_sae))
        return st


def encode_batch(sae: SparseAutoencoder, loaded, point: str, pics: Sequence, places: Sequence[int], layout: dict):
    """One batch of images through the model (the registry's forward) and the SAE: a partial :class:`IndexState`
    of the images at data-set ``places``. ``layout``: ``hw``, ``n_tokens``, ``offset``, ``n_scope``."""
    from vitviz.sae.activations import point_values

    x, _ = point_values(loaded, point, pics, tuple(layout["hw"]))
    if x.shape[1] != layout["n_tokens"]:
        raise FeatureIndexError(f"an image gave {x.shape[1]} tokens at {point}, the first {layout['n_tokens']}")
    n_scope, offset = layout["n_scope"], layout["offset"]
    xs = x[:, offset : offset + n_scope].reshape(-1, x.shape[-1]).to(sae.W_enc.device)  # the SAE's device
    with torch.no_grad():
        f = sae.encode(xs)
    positions = (torch.as_tensor(list(places), dtype=torch.int64)[:, None] * n_scope + torch.arange(n_scope)).ravel()
    return f, positions
