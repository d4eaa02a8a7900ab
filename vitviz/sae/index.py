"""An index of an SAE's features over a data set (``vitviz sae index``), and :func:`load_index` to read it back.

For every feature: its ``top_k`` strongest examples (image, token, activation) over the data set, how often it is
active (the share of tokens with activation > 0), its mean activation and a histogram of its active values.

**How it is built** (:func:`build_index`). The data set is read with ``evaluate``'s reader (a folder or a CSV, with
its bounds; files it cannot use are reported and skipped). Images go through the model in batches with the SAE's
point recorded by the hook registry (:func:`vitviz.sae.activations.point_values`, the forward training and
``measure`` use), the tokens the SAE reads (its scope: the patch tokens of a patches-only SAE, every token
otherwise) are encoded, and the batch is merged into running per-feature state
(:class:`~vitviz.sae.index_state.IndexState`): counts, sums, histogram counts, and the ``top_k`` best (activation,
image, token) so far, ordered by activation, then by the token's place in the data set, so ties go to the earlier
image and token and the result depends neither on the batch size nor on the order batches arrive in (the Ray
engine's, :mod:`vitviz.sae.index_ray`). Memory holds one batch's activations and the ``top_k x d_sae`` best, never
the data set's activations.

**The file** is ONE Parquet file, one row per feature (:data:`INDEX_COLUMNS`, each field's description also in
its Arrow field metadata), readable by pandas, DuckDB or polars like ``evaluate``'s results::

    SELECT feature, frequency, top_activation[1] FROM 'index.parquet' ORDER BY frequency DESC LIMIT 10;

**Resuming** (local engine). While it runs, the local engine keeps a checkpoint beside ``out``,
``OUT.partial.npz`` (:func:`partial_path`): the merged state's arrays, how many items of the listing are done
(batches run in listing order), the indexed images, the skipped list, and a header naming the run (the SAE's
digest, model, point, scope, input size, ``top_k`` and the data set's identity: a digest of its items). It is
written atomically (a temporary file, then ``os.replace``) at most every ``checkpoint_seconds`` after a batch, and
on Ctrl-C or an error; safe formats only (npz read with ``allow_pickle=False``, JSON). The same command run again
goes on after the last batch it holds (nothing done is computed again) and writes the file an uninterrupted run
writes (its ``created`` time aside). A checkpoint of another run (any header field differs) or one that cannot be
read is refused, naming what differs; ``overwrite`` (``--overwrite``) or deleting it starts over. It is removed
once the file is written. The Ray engine does not resume (and refuses to start while a checkpoint is there).

Its key-value metadata ``vitviz`` (JSON) names the SAE (``sae_digest``: SHA-256 of its weights), the model and the
point; :func:`load_index` refuses an index of another SAE, model or point, and any file that is not an index.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vitviz.models.digest import weights_digest
from vitviz.sae.index_state import (
    HIST_EDGES,
    FeatureIndexError,
    IndexState,
    encode_batch,
    sae_digest,
)
from vitviz.sae.model import SparseAutoencoder

__all__ = [
    "INDEX_FORMAT",
    "INDEX_SCHEMA_VERSION",
    "INDEX_COLUMNS",
    "INDEX_SCHEMA",
    "HIST_EDGES",
    "FeatureIndexError",
    "Example",
    "FeatureEntry",
    "FeatureIndex",
    "IndexReport",
    "IndexState",
    "sae_digest",
    "build_index",
    "partial_path",
    "load_index",
    "make_portable",
]

INDEX_FORMAT = "vitviz sae index"
INDEX_SCHEMA_VERSION = 1
META_KEY = b"vitviz"
MAX_INDEX_MB = 1024.0  # an index file's decoded size load_index agrees to read

_F64, _F32, _I32 = pa.float64(), pa.float32(), pa.int32()
INDEX_COLUMNS: dict[str, tuple[pa.DataType, str]] = {
    "feature": (_I32, "the feature's id, 0 .. d_sae - 1 (one row per feature, in order)"),
    "frequency": (_F64, "share of the tokens in scope (all images) on which the feature is active (> 0)"),
    "mean_activation": (_F64, "mean activation over every token in scope, zeros included"),
    "mean_active": (_F64, "mean activation over the tokens where it is active (null: never active)"),
    "max_activation": (_F32, "the largest activation seen (0: never active)"),
    "top_image_id": (pa.list_(pa.string()), "the top examples' image ids (evaluate's ids), strongest first"),
    "top_path": (pa.list_(pa.string()), "their image files as read"),
    "top_token": (pa.list_(_I32), "their token index at the point (prefix tokens first, then the patch grid)"),
    "top_row": (pa.list_(_I32), "their patch row in the point's grid (null for a prefix token)"),
    "top_col": (pa.list_(_I32), "their patch column (null for a prefix token)"),
    "top_activation": (pa.list_(_F32), "their activations, descending; only active examples (> 0) are listed"),
    "histogram": (pa.list_(pa.int64()), "counts of the active values in the 64 bins of the metadata's edges"),
}
INDEX_SCHEMA = pa.schema(
    [pa.field(n, t, metadata={"description": d}) for n, (t, d) in INDEX_COLUMNS.items()],
)

Progress = Callable[[str, int, int, dict], None]
PARTIAL_FORMAT = "vitviz sae index checkpoint"
PARTIAL_VERSION = 1
CHECKPOINT_SECONDS = 60.0  # the most time between checkpoints of a local run (each costs one write of the state)


# --- building -------------------------------------------------------------------------------------------------


@dataclass
class IndexReport:
    """What :func:`build_index` did: ``out`` written, ``images`` indexed, ``tokens`` encoded, ``skipped`` (where,
    why: the first 100 kept; ``skipped_total`` counts all), ``seconds``."""

    out: Path
    images: int
    tokens: int
    features: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    skipped_total: int = 0
    seconds: float = 0.0
    resumed: int = 0  # items of the listing a checkpoint had done (0: started afresh)


def partial_path(out: str | Path) -> Path:
    """Where a local index run keeps its checkpoint: ``OUT.partial.npz`` beside ``out``."""
    out = Path(out)
    return out.with_name(out.name + ".partial.npz")


def _data_digest(items) -> str:
    """SHA-256 of the listing: every item's id, path, label and box, in order."""
    h = hashlib.sha256()
    for it in items:
        h.update(json.dumps([it.image_id, it.path, it.label, list(it.box) if it.box else None]).encode())
        h.update(b"\n")
    return h.hexdigest()


_STATE_ARRAYS = {"active": 1, "total": 1, "hist": 1, "top_val": 2, "top_pos": 2}


def _save_partial(path: Path, header: dict, state: IndexState, done: int, images: dict, skipped) -> None:
    """Write the checkpoint atomically (a temporary file beside it, then ``os.replace``)."""
    places = np.asarray(sorted(images), dtype=np.int64)
    noted = {id(e) for e in skipped.noted}
    extra = {
        "done": int(done),
        "tokens": int(state.tokens),
        "images": [list(images[int(p)]) for p in places],
        "skipped": [{"where": s.where, "reason": s.reason, "noted": id(s) in noted} for s in skipped],
        "skipped_total": int(skipped.total),
    }
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as fh:
            np.savez(
                fh,
                header=np.frombuffer(json.dumps(header, sort_keys=True).encode(), np.uint8),
                extra=np.frombuffer(json.dumps(extra).encode(), np.uint8),
                places=places,
                **{name: getattr(state, name).numpy() for name in _STATE_ARRAYS},
            )
        os.replace(tmp, path)
    except BaseException as exc:  # the previous checkpoint (if any) stays as it was
        tmp.unlink(missing_ok=True)
        if not isinstance(exc, OSError):
            raise
        raise FeatureIndexError(
            f"cannot write the checkpoint {path} ({exc.strerror or exc}): free some space and run the same command "
            "again to go on from the last checkpoint"
        ) from None


def _load_partial(path: Path, header: dict, n_items: int):
    """The checkpoint's (state, done, images, skipped entries, skipped total), checked against this run's
    ``header``; :class:`FeatureIndexError` names what differs or what is damaged."""
    import torch

    from vitviz.evaluate.data import SkipLog, Skipped

    again = f"run with --overwrite to start over, or delete {path}"
    if not zipfile.is_zipfile(path):
        raise FeatureIndexError(f"the checkpoint {path} cannot be read (it is not an npz archive): {again}")
    try:
        with np.load(path, allow_pickle=False) as z:
            theirs = json.loads(z["header"].tobytes().decode())
            extra = json.loads(z["extra"].tobytes().decode())
            places = z["places"]
            arrays = {name: z[name] for name in _STATE_ARRAYS}
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FeatureIndexError(f"the checkpoint {path} cannot be read ({first}): {again}") from None
    if not isinstance(theirs, dict) or theirs.get("format") != PARTIAL_FORMAT:
        raise FeatureIndexError(f"{path} is not an index checkpoint: {again}")
    differ = [k for k in header if theirs.get(k) != header[k]]
    if differ:
        what = "; ".join(f"{k}: {theirs.get(k)!r} there, {header[k]!r} now" for k in differ)
        raise FeatureIndexError(f"the checkpoint {path} is of another run ({what}): {again}")
    d, k = header["d_sae"], header["top_k"]
    shapes = {"active": (d,), "total": (d,), "hist": (d * (len(HIST_EDGES) - 1),), "top_val": (k, d), "top_pos": (k, d)}
    dtypes = {"active": np.int64, "total": np.float64, "hist": np.int64, "top_val": np.float32, "top_pos": np.int64}
    try:
        done = int(extra["done"])
        imgs = extra["images"]
        if not 0 < done <= n_items or places.dtype != np.int64 or len(places) != len(imgs):
            raise ValueError("its counts do not fit the data set")
        if len(places) and not (places.min() >= 0 and places.max() < done):
            raise ValueError("its images lie outside the part done")
        for name, shape in shapes.items():
            if arrays[name].shape != shape or arrays[name].dtype != dtypes[name]:
                raise ValueError(f"its {name} has the wrong shape or type")
        state = IndexState(d, k)
        state.tokens = int(extra["tokens"])
        for name in _STATE_ARRAYS:
            setattr(state, name, torch.from_numpy(arrays[name].copy()))
        images = {int(p): (str(a), str(b)) for p, (a, b) in zip(places.tolist(), imgs, strict=True)}
        skipped = SkipLog()
        for e in extra["skipped"]:
            (skipped.note if e.get("noted") else skipped.append)(Skipped(str(e["where"]), str(e["reason"])))
        skipped.total = int(extra["skipped_total"])
    except Exception as exc:
        raise FeatureIndexError(f"the checkpoint {path} is damaged ({exc}): {again}") from None
    return state, done, images, skipped


def _existing_is_other(out: Path) -> bool:
    """True when ``out`` exists and is not a vitviz SAE index (so it is not silently replaced)."""
    if not out.exists():
        return False
    try:
        meta = json.loads((pq.read_schema(out).metadata or {})[META_KEY])
        return not (isinstance(meta, dict) and meta.get("format") == INDEX_FORMAT)
    except Exception:  # not Parquet, no metadata, bad JSON: not ours
        return True


def build_index(
    sae: SparseAutoencoder,
    loaded,
    data: str | Path,
    out: str | Path,
    *,
    model_source: str | None = None,
    top_k: int = 16,
    size=None,
    batch: int = 16,
    limit: int | None = None,
    max_rows: int | None = None,
    engine: str = "local",
    sae_path: str | Path | None = None,
    address: str | None = None,
    actors: int | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    checkpoint_seconds: float = CHECKPOINT_SECONDS,
) -> IndexReport:
    """Index ``sae``'s features over the images of ``data`` (a folder or a CSV) and write ``out`` (module
    docstring). ``loaded``: the model the SAE reads. Raises :class:`FeatureIndexError` (or the data reader's
    :class:`~vitviz.evaluate.data.DataError`) before any forward when the run cannot start; unreadable images
    are skipped and reported. ``engine``: ``local`` (this process) or ``ray`` (as ``evaluate``'s: decoding and
    forwards in a pool of actors, each loading the model by ``model_source`` and the SAE from ``sae_path``; their
    partial states are merged here, to the same file as the local engine's; ``address``: a cluster, ``actors``:
    the pool's size). The local engine resumes an interrupted run from its checkpoint (module docstring;
    ``checkpoint_seconds``: the most time between two; 0: after every batch)."""
    from vitviz.cli_checks import check_output_folder
    from vitviz.errors import VitvizError
    from vitviz.evaluate.data import MAX_ROWS, SkipLog, Skipped, load_item, read_dataset
    from vitviz.evaluate.results import write_table_atomic
    from vitviz.sae.activations import point_layout
    from vitviz.sae.load import check_point

    t0 = time.perf_counter()
    if engine not in ("local", "ray"):
        raise FeatureIndexError(f"unknown engine {engine!r}: local or ray")
    if engine == "ray" and sae_path is None:
        raise FeatureIndexError("the Ray engine loads the SAE in each actor: give its folder or file (sae_path)")
    if address is not None and engine != "ray":
        raise FeatureIndexError("--address connects to a Ray cluster: use it with --engine ray")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 1024:
        raise FeatureIndexError(f"--top-k must be a whole number in 1..1024, got {top_k!r}")
    if batch < 1:
        raise FeatureIndexError(f"the batch must be at least 1 image, got {batch}")
    point = sae.cfg.point
    if point is None:
        raise FeatureIndexError("this SAE does not say which point it reads: give the point (--point)")
    check_point(sae, loaded)
    out = Path(out)
    if out.is_dir():
        raise FeatureIndexError(f"--out '{out}' is a folder; give a file name such as index.parquet")
    if not overwrite and _existing_is_other(out):
        raise FeatureIndexError(
            f"--out '{out}' exists and is not a vitviz SAE index: choose another --out (or --overwrite)"
        )
    check_output_folder(out.parent, "--out's folder")
    dataset = read_dataset(data, limit=limit, max_rows=MAX_ROWS if max_rows is None else max_rows)
    skipped = SkipLog(dataset.skipped)
    items = dataset.items
    first, layout = None, None
    for it in items:  # the first readable image gives the layout every batch must have
        try:
            first = load_item(it)
        except VitvizError:
            continue
        layout = point_layout(loaded, point, first, size)
        break
    if layout is None:
        raise FeatureIndexError(f"none of the {len(items)} images of '{data}' could be read")
    hw, n_tokens, n_prefix, n_patch, width = layout
    if width != sae.d_in:
        raise FeatureIndexError(
            f"the SAE reads {sae.d_in}-wide activations at {point}; '{loaded.name}' has {width} there: it was "
            "trained on another model"
        )
    patches_only = sae.cfg.tokens == "patches"
    n_scope, offset = (n_patch, n_prefix) if patches_only else (n_tokens, 0)
    gh_gw = _grid(loaded, point, first, hw)
    state = IndexState(sae.d_sae, top_k)
    images: dict[int, tuple[str, str]] = {}  # data-set place -> (image_id, path) of every indexed image
    layout_d = {"hw": list(hw), "n_tokens": n_tokens, "offset": offset, "n_scope": n_scope}
    done = 0
    partial = partial_path(out)
    header = {
        "format": PARTIAL_FORMAT,
        "version": PARTIAL_VERSION,
        "sae_digest": sae_digest(sae),
        "model": loaded.name,
        "point": point,
        "scope": "patches" if patches_only else "all",
        "input_size": list(hw),
        "top_k": top_k,
        "d_sae": sae.d_sae,
        "data": _data_digest(items),
        "items": len(items),
    }
    resumed = 0
    if overwrite:
        partial.unlink(missing_ok=True)
    elif partial.exists():
        if engine == "ray":
            raise FeatureIndexError(
                f"{partial} holds an interrupted local run: the Ray engine does not resume; run with --engine local "
                f"to go on, or with --overwrite (or delete it) to start over"
            )
        state, done, images, skipped = _load_partial(partial, header, len(items))
        resumed = done
    if progress:
        progress("index", done, len(items), {})
    if engine == "ray":
        from vitviz.sae.index_ray import run_ray

        def finish(n: int) -> None:
            nonlocal done
            done += n
            if progress:
                progress("index", done, len(items), {})

        config = {
            "model": model_source if model_source is not None else loaded.name,
            "sae": str(sae_path),
            "point": point,
            "digest": sae_digest(sae),
            "top_k": top_k,
            "d_sae": sae.d_sae,
            "layout": layout_d,
            "device": None,
        }
        run_ray(config, items, state, images, skipped, finish, address=address, actors=actors)
    saved_at, busy = time.monotonic(), False
    try:
        for start in range(done, len(items) if engine == "local" else 0, batch):
            chunk = items[start : start + batch]
            pics, ok, lost = [], [], []
            for place, it in enumerate(chunk, start):
                try:
                    pics.append(load_item(it))
                    ok.append((place, it))
                except VitvizError as exc:
                    lost.append(Skipped(it.source or it.path, str(exc)))
            f = None
            if pics:
                try:
                    f, positions = encode_batch(sae, loaded, point, pics, [p for p, _ in ok], layout_d)
                except FeatureIndexError:
                    raise
                except VitvizError as exc:
                    lost += [Skipped(it.source or it.path, str(exc)) for _, it in ok]
            busy = True  # the batch is merged: the state is not a checkpoint's until it all is
            if f is not None:
                state.add(f, positions)
                images.update((p, (it.image_id, it.path)) for p, it in ok)
            for entry in lost:
                skipped.append(entry)
            done = start + len(chunk)
            busy = False
            if engine == "local" and done < len(items) and time.monotonic() - saved_at >= checkpoint_seconds:
                _save_partial(partial, header, state, done, images, skipped)
                saved_at = time.monotonic()
            if progress:
                progress("index", done, len(items), {})
    except BaseException:  # Ctrl-C, a crash, a full disk: keep what is done for the next run
        if engine == "local" and not busy and done > resumed:
            # if it cannot be written, the previous checkpoint (if any) stays; the original error is the one to report
            with contextlib.suppress(FeatureIndexError):
                _save_partial(partial, header, state, done, images, skipped)
        raise
    if not images:
        raise FeatureIndexError("no image could be indexed: every one was skipped")
    table = _table(state, images, n_scope, offset, n_prefix, gh_gw)
    meta = {
        "format": INDEX_FORMAT,
        "schema_version": INDEX_SCHEMA_VERSION,
        "sae_digest": sae_digest(sae),
        "sae": sae.cfg.describe(),
        "sae_source": sae.cfg.source,
        "d_in": sae.d_in,
        "d_sae": sae.d_sae,
        "point": point,
        "scope": "patches" if patches_only else "all",
        "model": loaded.name,
        "model_digest": weights_digest(loaded),
        "model_source": model_source if model_source is not None else loaded.name,
        "input_size": list(hw),
        "grid": list(gh_gw),
        "prefix_tokens": n_prefix,
        "top_k": top_k,
        "images": len(images),
        "tokens": state.tokens,
        "histogram_edges": [float(e) for e in HIST_EDGES],
        "data": str(dataset.source),
        "engine": engine,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "skipped": [{"where": s.where, "reason": s.reason} for s in skipped],
        "skipped_total": skipped.total,
    }
    write_table_atomic(table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()}), out)
    if engine == "local":
        partial.unlink(missing_ok=True)
    return IndexReport(
        out=out,
        images=len(images),
        tokens=state.tokens,
        features=sae.d_sae,
        skipped=[(s.where, s.reason) for s in skipped],
        skipped_total=skipped.total,
        seconds=time.perf_counter() - t0,
        resumed=resumed,
    )


def _grid(loaded, point: str, image, hw) -> tuple[int, int]:
    """The point's patch grid (from the image's Run, cached: :func:`point_layout` made it)."""
    from vitviz.capture.run import get_run
    from vitviz.sae.run import token_grid

    return token_grid(get_run(loaded, image, size=hw, gradients=False), point)[1]


def _table(
    state: IndexState,
    images: dict[int, tuple[str, str]],
    n_scope: int,
    offset: int,
    n_prefix: int,
    grid: tuple[int, int],
) -> pa.Table:
    gw = grid[1]
    n = max(state.tokens, 1)
    active = state.active.numpy()
    total = state.total.numpy()
    top_val, top_pos = state.top_val.numpy(), state.top_pos.numpy()
    cols: dict[str, list] = {name: [] for name in INDEX_COLUMNS}
    nb = len(HIST_EDGES) - 1
    hist = state.hist.numpy().reshape(state.d_sae, nb)
    for i in range(state.d_sae):
        keep = top_val[:, i] > 0
        vals, poss = top_val[keep, i], top_pos[keep, i]
        img = (poss // n_scope).astype(np.int64)
        tok = (poss % n_scope + offset).astype(np.int64)
        patch = tok - n_prefix
        cols["feature"].append(i)
        cols["frequency"].append(float(active[i]) / n)
        cols["mean_activation"].append(float(total[i]) / n)
        cols["mean_active"].append(float(total[i]) / float(active[i]) if active[i] else None)
        cols["max_activation"].append(float(vals[0]) if len(vals) else 0.0)
        cols["top_image_id"].append([images[j][0] for j in img])
        cols["top_path"].append([images[j][1] for j in img])
        cols["top_token"].append(tok.tolist())
        cols["top_row"].append([int(p // gw) if p >= 0 else None for p in patch])
        cols["top_col"].append([int(p % gw) if p >= 0 else None for p in patch])
        cols["top_activation"].append(vals.astype(np.float32).tolist())
        cols["histogram"].append(hist[i].tolist())
    return pa.Table.from_pydict(cols, schema=INDEX_SCHEMA)


def make_portable(path: str | Path, **meta: Any) -> None:
    """Rewrite the index at ``path`` so that it can move with its images: every example path inside the index's
    folder is stored relative to it (the reader resolves it there: :meth:`FeatureIndex.feature`); ``meta``
    replaces header fields (e.g. ``data``, ``sae_source``: what the file says it was made from, not where that was
    on the machine that made it). Paths outside the folder stay as they are."""
    from vitviz.evaluate.results import write_table_atomic

    path = Path(path)
    table = pq.read_table(path)
    header = json.loads(table.schema.metadata[META_KEY])
    here = path.resolve().parent

    def portable(p: str) -> str:
        full = Path(p).resolve()
        return full.relative_to(here).as_posix() if full.is_relative_to(here) else p

    rows = [[portable(p) for p in row] for row in table.column("top_path").to_pylist()]
    table = table.set_column(
        table.schema.get_field_index("top_path"), INDEX_SCHEMA.field("top_path"), pa.array(rows, pa.list_(pa.string()))
    )
    header.update(meta)
    write_table_atomic(table.replace_schema_metadata({META_KEY: json.dumps(header).encode()}), path)


# --- reading ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One top example of a feature: the image (``image_id``, ``path``), the ``token`` at the point (``row``,
    ``col`` in the grid; None for a prefix token) and its ``activation``."""

    image_id: str
    path: str
    token: int
    row: int | None
    col: int | None
    activation: float


@dataclass(frozen=True)
class FeatureEntry:
    """One feature's row of an index (:data:`INDEX_COLUMNS`); ``histogram`` counts over ``edges``."""

    feature: int
    frequency: float
    mean_activation: float
    mean_active: float | None
    max_activation: float
    examples: tuple[Example, ...]
    histogram: np.ndarray
    edges: np.ndarray


@dataclass(frozen=True)
class FeatureIndex:
    """An index read back and checked against its SAE and model: the table (one row per feature) and ``meta``."""

    table: pa.Table = field(repr=False)
    meta: dict
    path: str

    @property
    def d_sae(self) -> int:
        return int(self.meta["d_sae"])

    def to_pandas(self):
        return self.table.to_pandas()

    def frequencies(self) -> np.ndarray:
        return self.table.column("frequency").to_numpy()

    def feature(self, i: int) -> FeatureEntry:
        """Feature ``i``'s row; a relative example path is read relative to the index file's folder
        (:func:`make_portable`)."""
        if not 0 <= int(i) < self.d_sae:
            raise FeatureIndexError(f"feature {i} is outside 0..{self.d_sae - 1}")
        row = self.table.slice(int(i), 1).to_pylist()[0]
        here = Path(self.path).parent
        examples = tuple(
            Example(iid, path if os.path.isabs(path) else str(here / path), int(tok), r, c, float(a))
            for iid, path, tok, r, c, a in zip(
                row["top_image_id"],
                row["top_path"],
                row["top_token"],
                row["top_row"],
                row["top_col"],
                row["top_activation"],
                strict=True,
            )
        )
        return FeatureEntry(
            feature=int(row["feature"]),
            frequency=float(row["frequency"]),
            mean_activation=float(row["mean_activation"]),
            mean_active=row["mean_active"],
            max_activation=float(row["max_activation"]),
            examples=examples,
            histogram=np.asarray(row["histogram"], np.int64),
            edges=np.asarray(self.meta["histogram_edges"], np.float64),
        )


def _short(digest: Any) -> str:
    return str(digest)[:12]


def _check_lists(table: pa.Table, name: str, bins: int) -> None:
    """Every row's example lists have one length, at most the header's ``top_k``; every histogram ``bins``."""
    import pyarrow.compute as pc

    lengths = [pc.list_value_length(table.column(c)).to_numpy(zero_copy_only=False) for c in _EXAMPLE_LISTS]
    if any(not np.array_equal(lengths[0], n) for n in lengths[1:]):
        raise FeatureIndexError(f"{name}'s example lists differ in length within a row: it is damaged")
    hist = pc.list_value_length(table.column("histogram")).to_numpy(zero_copy_only=False)
    if table.num_rows and not (hist == bins).all():
        raise FeatureIndexError(f"{name}'s histograms do not have the {bins} bins of its edges: it is damaged")


_EXAMPLE_LISTS = ("top_image_id", "top_path", "top_token", "top_row", "top_col", "top_activation")


def _check_model(name: str, meta: dict, loaded) -> None:
    """The index was built on ``loaded``'s weights: by their digest where the file records it (a copied folder
    passes, a model retrained under the same name does not), by the model's name in files written before."""
    built = meta.get("model_digest")
    if built is None:
        if meta.get("model") != loaded.name:
            raise FeatureIndexError(
                f"{name} was built on the model {meta.get('model')!r}, not {loaded.name!r}: the same SAE's features "
                "read another model's activations there"
            )
        return
    if built != weights_digest(loaded):
        raise FeatureIndexError(
            f"{name} was built on other weights (the model {meta.get('model')!r}, weights {_short(built)}...), not "
            f"those of {loaded.name!r} ({_short(weights_digest(loaded))}...): the same SAE's features read another "
            "model's activations there; build the index again on this model with `vitviz sae index`"
        )


def load_index(path: str | Path, sae: SparseAutoencoder, loaded, *, max_mb: float = MAX_INDEX_MB) -> FeatureIndex:
    """Read the index at ``path`` and check that it is an index of ``sae`` (its weights' digest) on ``loaded``'s
    model at the SAE's point; :class:`FeatureIndexError` says what is wrong (never a traceback of the reader)."""
    p = Path(path).expanduser()
    name = f"'{p.name}'"
    if not p.exists():
        raise FeatureIndexError(
            f"{name} does not exist: build an index with `vitviz sae index --sae DIR --data FOLDER`"
        )
    if p.is_dir():
        raise FeatureIndexError(f"{name} is a folder; give the .parquet file `vitviz sae index --out` wrote")
    try:
        pf = pq.ParquetFile(str(p))
    except Exception as exc:  # pyarrow raises many kinds for a damaged file
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FeatureIndexError(f"{name} is not a Parquet file ({first}): it is not an SAE index") from None
    try:
        meta = json.loads((pf.schema_arrow.metadata or {})[META_KEY])
        if not isinstance(meta, dict) or meta.get("format") != INDEX_FORMAT:
            raise ValueError
        version = int(meta["schema_version"])
    except Exception:
        raise FeatureIndexError(
            f"{name} is a Parquet file but not a vitviz SAE index (no index header): build one with `vitviz sae index`"
        ) from None
    if version > INDEX_SCHEMA_VERSION:
        raise FeatureIndexError(f"{name} is index version {version}; this vitviz reads up to {INDEX_SCHEMA_VERSION}")
    mine = sae_digest(sae)
    if meta.get("sae_digest") != mine:
        raise FeatureIndexError(
            f"{name} is an index of another SAE (weights {_short(meta.get('sae_digest'))}..., this SAE's "
            f"{_short(mine)}...: {meta.get('sae', '?')}): build one for this SAE with `vitviz sae index`"
        )
    if meta.get("point") != sae.cfg.point:
        raise FeatureIndexError(f"{name} indexes the point {meta.get('point')!r}; this SAE reads {sae.cfg.point!r}")
    if loaded is not None:
        _check_model(name, meta, loaded)
    try:
        md = pf.metadata
        need = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
        if md.num_rows != sae.d_sae or int(meta.get("d_sae", -1)) != sae.d_sae:
            raise FeatureIndexError(f"{name} has {md.num_rows} rows, this SAE {sae.d_sae} features: it is damaged")
        if need > max_mb * 2**20:
            raise FeatureIndexError(
                f"{name} would take {need / 2**20:.0f} MB decoded, over the {max_mb:g} MB vitviz reads"
            )
        missing = [c for c in INDEX_SCHEMA.names if c not in pf.schema_arrow.names]
        if missing:
            raise FeatureIndexError(f"{name} lacks the column(s) {', '.join(missing)}: it is not a complete index")
        table = pf.read(columns=INDEX_SCHEMA.names).cast(INDEX_SCHEMA)
        edges = meta["histogram_edges"]
        if not (isinstance(edges, list) and all(isinstance(e, (int, float)) and math.isfinite(e) for e in edges)):
            raise FeatureIndexError(f"{name}'s histogram edges are not numbers: it is damaged")
        if table.column("feature").to_pylist() != list(range(sae.d_sae)):
            raise FeatureIndexError(f"{name}'s rows are not features 0..{sae.d_sae - 1} in order: it is damaged")
        _check_lists(table, name, len(edges) - 1)
    except FeatureIndexError:
        raise
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FeatureIndexError(f"{name} is damaged ({first}): build the index again") from None
    return FeatureIndex(table=table, meta=meta, path=str(p))
