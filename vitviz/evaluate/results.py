"""Evaluation results as ONE Parquet file: a tidy table, one row per (image, method).

Readable by anything that reads Parquet::

    import pandas as pd
    df = pd.read_parquet("results.parquet")
    df.groupby("method")[["deletion_area", "insertion_area"]].agg(["mean", "sem"])

    -- DuckDB
    SELECT method, avg(deletion_area), avg(insertion_area), avg(peak_in_box::INT)
    FROM 'results.parquet' GROUP BY method;

    import polars as pl; pl.read_parquet("results.parquet")

**Columns** (:data:`SCHEMA`; each field also carries its description in the Arrow
field metadata, key ``description``):

=====================  ===================  ============================================================
``image_id``           string               stable id: path relative to the folder, or the CSV's file
``path``               string               the image file as read
``label``              string, null         true class from the CSV (null without)
``image_width``        int32                original image size in pixels
``image_height``       int32
``box_x0`` .. ``_y1``  float64, null        object box in pixels of the MODEL INPUT (rescaled), x1/y1 excl.
``method``             string               explanation method (``vitviz.methods``)
``class_index``        int64                class explained and scored: the model's top-1
``class_label``        string               its name
``correct``            bool, null           ``class_label == label`` (null without a label)
``probability``        float64              softmax probability of the class, unperturbed input
``deletion_area``      float64              area under the deletion curve (lower: more faithful)
``insertion_area``     float64              area under the insertion curve (higher: more faithful)
``peak_in_box``        bool, null           the map's peak cell centre lies in the box (null: no box)
``fractions``          list<float64> (21)   fraction of cells perturbed at each point (k / N)
``deletion_curve``     list<float64> (21)   probability of the class at each point, deletion
``insertion_curve``    list<float64> (21)   the same, insertion
``model``              string               model name as loaded
``input_height``       int32                model input size in pixels
``input_width``        int32
``seed``               int64                the run's seed (``--seed``)
``image_seed``         int64                seed of this image's random map: :func:`image_seed`
``head_distance``      list<list<float64>>  per block (depth), per head: mean attention distance (px)
``head_entropy``       list<list<float64>>  per block, per head: attention entropy (nats)
=====================  ===================  ============================================================

Per-image columns (``path`` .. ``box_*``, ``class_*``, ``probability``, ``input_*``,
``head_*``) repeat on each method row of the image; for per-image statistics take one
row per ``image_id`` (:meth:`Results.images`). ``head_*`` are ``[block][head]`` from
the capture's blocks (:func:`vitviz.analysis.stats.summary_table`), null where a
block has fewer heads than the widest; :meth:`Results.head_stats` stacks them into an
``(images, blocks, heads)`` array, e.g. for "mean attention distance vs depth per head
with its spread over the images".

**File metadata**: the Parquet key-value metadata key ``vitviz`` holds JSON with
``format`` (``"vitviz evaluation results"``), ``schema_version`` (:data:`SCHEMA_VERSION`),
the run's ``model``, ``methods``, ``seed``, ``size``, ``data``, ``engine``,
``created`` (UTC, ISO 8601), ``images`` (evaluated), ``skipped`` (the first 100 inputs not
evaluated, a list of ``{"where", "reason"}``), ``skipped_total`` (all of them, counted) and
``points`` (21). Read it with
``pyarrow.parquet.read_schema(path).metadata[b"vitviz"]`` or DuckDB's
``parquet_kv_metadata('results.parquet')``. :func:`read_results` refuses any file
without it (:class:`ResultsError`).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vitviz.errors import VitvizError

__all__ = [
    "remember_last_run",
    "last_run",
    "SCHEMA_VERSION",
    "FORMAT",
    "META_KEY",
    "SCHEMA",
    "COLUMN_DOCS",
    "ResultsError",
    "ResultsLimits",
    "MethodSummary",
    "Versus",
    "sign_test",
    "versus_columns",
    "Results",
    "image_seed",
    "make_rows",
    "rows_to_table",
    "run_metadata",
    "write_results",
    "write_table_atomic",
    "header_problem",
    "read_results",
]

SCHEMA_VERSION = 1
FORMAT = "vitviz evaluation results"
META_KEY = b"vitviz"

_F64 = pa.float64()
COLUMN_DOCS: dict[str, tuple[pa.DataType, str]] = {
    "image_id": (pa.string(), "stable image id: path relative to the folder, or the CSV's file cell"),
    "path": (pa.string(), "the image file as read"),
    "label": (pa.string(), "true class from the CSV (null without)"),
    "image_width": (pa.int32(), "original image width in pixels"),
    "image_height": (pa.int32(), "original image height in pixels"),
    "box_x0": (_F64, "object box, left, in pixels of the model input (null without a box)"),
    "box_y0": (_F64, "object box, top, in pixels of the model input"),
    "box_x1": (_F64, "object box, right (exclusive), in pixels of the model input"),
    "box_y1": (_F64, "object box, bottom (exclusive), in pixels of the model input"),
    "method": (pa.string(), "explanation method (vitviz.methods)"),
    "class_index": (pa.int64(), "class explained and scored: the model's top-1"),
    "class_label": (pa.string(), "name of that class"),
    "correct": (pa.bool_(), "class_label == label (null without a label)"),
    "probability": (_F64, "softmax probability of the class for the unperturbed input"),
    "deletion_area": (_F64, "area under the deletion curve, trapezoid rule over k/N (lower: more faithful)"),
    "insertion_area": (_F64, "area under the insertion curve (higher: more faithful)"),
    "peak_in_box": (pa.bool_(), "the centre of the map's largest cell lies in the box (null without a box)"),
    "fractions": (pa.list_(_F64), "fraction of cells perturbed at each of the 21 points (k / N)"),
    "deletion_curve": (pa.list_(_F64), "probability of the class at each point, deletion"),
    "insertion_curve": (pa.list_(_F64), "probability of the class at each point, insertion"),
    "model": (pa.string(), "model name as loaded"),
    "input_height": (pa.int32(), "model input height in pixels"),
    "input_width": (pa.int32(), "model input width in pixels"),
    "seed": (pa.int64(), "the run's seed"),
    "image_seed": (pa.int64(), "seed of this image's random map, derived from seed and image_id"),
    "head_distance": (pa.list_(pa.list_(_F64)), "[block][head] mean attention distance in pixels"),
    "head_entropy": (pa.list_(pa.list_(_F64)), "[block][head] attention entropy in nats"),
}
SCHEMA = pa.schema([pa.field(name, dtype, metadata={"description": doc}) for name, (dtype, doc) in COLUMN_DOCS.items()])
PER_IMAGE = (
    "image_id",
    "path",
    "label",
    "image_width",
    "image_height",
    "box_x0",
    "box_y0",
    "box_x1",
    "box_y1",
    "class_index",
    "class_label",
    "correct",
    "probability",
    "model",
    "input_height",
    "input_width",
    "seed",
    "image_seed",
    "head_distance",
    "head_entropy",
)


class ResultsError(VitvizError):
    """A file that is not (or no longer) a vitviz results file; the message says what it is."""


@dataclass(frozen=True)
class ResultsLimits:
    """What :func:`read_results` agrees to decode, checked from the Parquet footer before any column is read.

    A few KB of Parquet can stand for gigabytes once decoded (a long string stored once in a
    dictionary and repeated on every row, a list of millions of equal values run-length
    encoded), so the footer's counts are checked first: rows, columns, row groups, the
    uncompressed bytes of the row groups and the number of values of every column, list
    elements included (``num_values``). Strings are read as dictionaries (as stored) and
    their decoded size is checked before they are expanded. A row of a ViT-Base run (12 x 12
    head tables, 21-point curves) takes about 4.5 KB decoded, so the default 512 MB holds
    about 110,000 rows: 14,000 images with 8 methods.
    """

    max_rows: int = 200_000
    max_columns: int = 64
    max_row_groups: int = 1_000
    max_bytes: int = 512 * 2**20  # decoded size of the columns read, and the uncompressed size of their pages

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_columns", "max_row_groups", "max_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


_WIDTH = {"DOUBLE": 8, "FLOAT": 4, "INT64": 8, "INT32": 4, "BOOLEAN": 1, "INT96": 12}
_STRINGS = [name for name, (dtype, _) in COLUMN_DOCS.items() if pa.types.is_string(dtype)]


def _mb(n: float) -> str:
    return f"{n / 2**20:,.0f} MB" if n >= 2**20 else f"{n / 1024:,.0f} KB"


def _check_footer(pf: pq.ParquetFile, name: str, limits: ResultsLimits) -> None:
    """Refuse a file whose footer promises more than ``limits`` (nothing is decoded here)."""
    md = pf.metadata
    if md.num_rows > limits.max_rows:
        raise ResultsError(f"{name} has {md.num_rows:,} rows; vitviz reads at most {limits.max_rows:,}")
    if md.num_columns > limits.max_columns:
        raise ResultsError(f"{name} has {md.num_columns:,} columns; vitviz reads at most {limits.max_columns:,}")
    if md.num_row_groups > limits.max_row_groups:
        raise ResultsError(
            f"{name} has {md.num_row_groups:,} row groups; vitviz reads at most {limits.max_row_groups:,}"
        )
    wanted = set(SCHEMA.names)
    stored = decoded = 0
    for g in range(md.num_row_groups):
        group = md.row_group(g)
        for c in range(group.num_columns):
            col = group.column(c)
            if col.path_in_schema.split(".")[0] not in wanted:
                continue  # never read
            stored += max(0, col.total_uncompressed_size)
            values = max(0, col.num_values)  # every value of the leaf column, list elements included
            if col.physical_type in _WIDTH:
                decoded += values * (_WIDTH[col.physical_type] + (4 if "." in col.path_in_schema else 0))
            else:  # strings: their own pages here, their expanded size after reading (see read_results)
                decoded += values * 4
            if max(stored, decoded) > limits.max_bytes:
                raise ResultsError(
                    f"{name} would take more than {_mb(limits.max_bytes)} of memory once decoded "
                    f"(its column {col.path_in_schema.split('.')[0]!r} alone holds {values:,} values); "
                    "vitviz refuses it. Split the run, or evaluate fewer images."
                )


def _expand_strings(table: pa.Table, name: str, limits: ResultsLimits) -> pa.Table:
    """Dictionary-read string columns -> plain strings, after checking the size they expand to."""
    total = table.nbytes
    for col in _STRINGS:
        column = table.column(col)
        if not pa.types.is_dictionary(column.type):
            continue
        for chunk in column.chunks:
            lengths = pc.binary_length(chunk.dictionary).cast(pa.int64())
            total += int(pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0)
            if total > limits.max_bytes:
                raise ResultsError(
                    f"{name} would take more than {_mb(limits.max_bytes)} of memory once decoded (its column "
                    f"{col!r} repeats long texts); vitviz refuses it."
                )
    return table.cast(pa.schema([pa.field(f.name, SCHEMA.field(f.name).type) for f in table.schema]))


def image_seed(seed: int, image_id: str) -> int:
    """The random map's seed for one image: the first 4 bytes of ``sha256(f"{seed}/{image_id}")``, little-endian.

    A pure function of the run's seed and the image id, so both engines, and a resumed
    run, draw the same map; different images get different maps (one fixed map for all
    images would score one ordering, not the random baseline).
    """
    return int.from_bytes(hashlib.sha256(f"{int(seed)}/{image_id}".encode()).digest()[:4], "little")


def _nested(table: np.ndarray) -> list[list[float | None]]:
    return [[None if not math.isfinite(v) else float(v) for v in row] for row in np.asarray(table, dtype=np.float64)]


def make_rows(
    *,
    image_id: str,
    path: str,
    label: str | None,
    image_wh: tuple[int, int],
    box: Sequence[float] | None,
    scored: Mapping[str, Any],
    model: str,
    input_hw: tuple[int, int],
    seed: int,
    seed_of_image: int,
    head_distance: np.ndarray,
    head_entropy: np.ndarray,
) -> list[dict]:
    """Rows of one image, one per method, from :class:`~vitviz.evaluate.faithfulness.Faithfulness` results.

    ``box``: in pixels of the model input (already rescaled), or None.
    """
    distance, entropy = _nested(head_distance), _nested(head_entropy)
    bx = [None] * 4 if box is None else [float(v) for v in box]
    rows = []
    for method, f in scored.items():
        rows.append(
            {
                "image_id": image_id,
                "path": path,
                "label": label,
                "image_width": int(image_wh[0]),
                "image_height": int(image_wh[1]),
                "box_x0": bx[0],
                "box_y0": bx[1],
                "box_x1": bx[2],
                "box_y1": bx[3],
                "method": method,
                "class_index": int(f.class_index),
                "class_label": f.label,
                "correct": None if label is None else f.label == label,
                "probability": float(f.probability),
                "deletion_area": float(f.deletion_area),
                "insertion_area": float(f.insertion_area),
                "peak_in_box": f.peak_in_box,
                "fractions": [float(v) for v in f.fractions],
                "deletion_curve": [float(v) for v in f.deletion],
                "insertion_curve": [float(v) for v in f.insertion],
                "model": model,
                "input_height": int(input_hw[0]),
                "input_width": int(input_hw[1]),
                "seed": int(seed),
                "image_seed": int(seed_of_image),
                "head_distance": distance,
                "head_entropy": entropy,
            }
        )
    return rows


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows (dicts with the :data:`SCHEMA` columns) -> a table of exactly that schema."""
    return pa.Table.from_pylist(list(rows), schema=SCHEMA)


def run_metadata(**fields: Any) -> dict:
    """The ``vitviz`` file metadata: ``format``, ``schema_version``, ``created`` and the run's ``fields``."""
    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        **fields,
    }


def write_table_atomic(table: pa.Table, path: str | Path) -> Path:
    """Write ``table`` as Parquet at ``path`` atomically: a hidden temporary file beside it, then a rename.

    A reader (or a resumed run) sees either no file or the whole file, never a part of one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_results(table: pa.Table, path: str | Path, meta: Mapping[str, Any]) -> Path:
    """Write the final results file (atomically) with the ``vitviz`` metadata ``meta``."""
    table = table.cast(SCHEMA).replace_schema_metadata({META_KEY: json.dumps(dict(meta)).encode()})
    return write_table_atomic(table, path)


@dataclass(frozen=True)
class MethodSummary:
    """One method over the images: means and their standard errors (``sd / sqrt(n)``), peak-in-box rate."""

    method: str
    n: int
    deletion_mean: float
    deletion_se: float
    insertion_mean: float
    insertion_se: float
    peak_in_box_rate: float | None  # over the images with a box; None when none has one
    n_boxes: int


@dataclass(frozen=True)
class Versus:
    """One method against a baseline method, image by image (paired, on the images both were scored on).

    ``difference_mean`` +- ``difference_se``: the mean over images of (method's area - baseline's
    area) and its standard error (``sd / sqrt(n)``). ``better_share`` / ``tie_share`` /
    ``worse_share``: the shares of images where the method's area is better (insertion: higher;
    deletion: lower) by more than ``tolerance``, within ``tolerance`` of the baseline's, or worse by
    more. ``sign_p``: the two-sided exact sign test of better against worse images (ties left
    out; 1.0 when there are none): the chance of a split at least this uneven if better and worse
    were equally likely. Two readings of "faster than random": the mean difference weighs by how
    much, the shares and the sign test how often.
    """

    method: str
    baseline: str
    area: str  # "insertion" or "deletion"
    n: int
    difference_mean: float
    difference_se: float
    better_share: float
    tie_share: float
    worse_share: float
    tolerance: float
    sign_p: float


def sign_test(better: int, worse: int) -> float:
    """Two-sided exact sign test: ``P(min(B, W) <= min(better, worse)) * 2`` (capped at 1) for B ~ Bin(n, 1/2)."""
    n, k = better + worse, min(better, worse)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0**n
    return min(1.0, 2.0 * tail)


BETTER_MEANS = {"insertion": "higher than the baseline", "deletion": "lower than the baseline"}


def versus_columns(rows: Sequence[Versus]) -> dict[str, np.ndarray]:
    """:class:`Versus` rows as named columns (units in the names) for a table or CSV, one row per comparison.

    Areas are probabilities averaged over the curve, so their differences are in probability;
    shares are percentages of the ``images`` compared; ``better means`` states the area's
    direction (insertion: higher, deletion: lower). Nothing is computed here: each number is
    the row's own field (shares x 100).
    """
    fields = [
        ("method", lambda v: v.method, str),
        ("baseline", lambda v: v.baseline, str),
        ("area", lambda v: v.area, str),
        ("better means", lambda v: BETTER_MEANS[v.area], str),
        ("images", lambda v: v.n, np.int64),
        ("mean area difference, method - baseline (probability)", lambda v: v.difference_mean, np.float64),
        ("standard error of the difference (probability)", lambda v: v.difference_se, np.float64),
        ("better (% of images)", lambda v: 100.0 * v.better_share, np.float64),
        ("tie (% of images)", lambda v: 100.0 * v.tie_share, np.float64),
        ("worse (% of images)", lambda v: 100.0 * v.worse_share, np.float64),
        ("tie tolerance (probability)", lambda v: v.tolerance, np.float64),
        ("sign test p (two-sided)", lambda v: v.sign_p, np.float64),
    ]
    return {name: np.array([get(v) for v in rows], dtype=dtype) for name, get, dtype in fields}


def _mean_se(values: np.ndarray) -> tuple[float, float]:
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return math.nan, math.nan
    se = float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else math.nan
    return float(v.mean()), se


@dataclass(frozen=True)
class Results:
    """A results file read back: the :data:`SCHEMA` table and its ``vitviz`` metadata."""

    table: pa.Table = field(repr=False)
    meta: dict
    path: str | None = None

    def to_pandas(self):
        """The table as a pandas DataFrame (one row per image and method)."""
        return self.table.to_pandas()

    @property
    def methods(self) -> tuple[str, ...]:
        """Methods present, in the order of the run's ``methods`` (others after, sorted)."""
        present = set(self.table.column("method").to_pylist())
        order = [m for m in self.meta.get("methods", []) if m in present]
        return tuple(order + sorted(present - set(order)))

    @property
    def num_images(self) -> int:
        return len(set(self.table.column("image_id").to_pylist()))

    def method_rows(self, method: str) -> pa.Table:
        return self.table.filter(pc.equal(self.table.column("method"), method))

    def images(self) -> pa.Table:
        """One row per image (its first method row), per-image columns only."""
        ids = self.table.column("image_id").to_pylist()
        first = sorted({i: k for k, i in reversed(list(enumerate(ids)))}.values())
        return self.table.take(pa.array(first, type=pa.int64())).select(list(PER_IMAGE))

    def summary(self) -> list[MethodSummary]:
        """Per method: mean +- standard error of both areas, and the peak-in-box rate over images with a box."""
        out = []
        for m in self.methods:
            t = self.method_rows(m)
            d_mean, d_se = _mean_se(t.column("deletion_area").to_numpy())
            i_mean, i_se = _mean_se(t.column("insertion_area").to_numpy())
            peaks = [p for p in t.column("peak_in_box").to_pylist() if p is not None]
            rate = float(np.mean(peaks)) if peaks else None
            out.append(MethodSummary(m, t.num_rows, d_mean, d_se, i_mean, i_se, rate, len(peaks)))
        return out

    def versus(self, baseline: str = "random", area: str = "insertion", tolerance: float = 0.001) -> list[Versus]:
        """Every other method against ``baseline`` on ``area`` ("insertion" or "deletion"), image by image.

        ``tolerance``: area differences within it count as ties (areas are probabilities averaged
        over the curve; 0.001 is a tenth of a percentage point). Empty when ``baseline`` is not in
        the file. Images scored by only one of the two are left out.
        """
        if area not in ("insertion", "deletion"):
            raise ValueError(f"area must be 'insertion' or 'deletion', got {area!r}")
        if not tolerance >= 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance}")
        if baseline not in self.methods:
            return []

        def by_image(method: str) -> dict[str, float]:
            t = self.method_rows(method)
            return dict(zip(t.column("image_id").to_pylist(), t.column(f"{area}_area").to_pylist(), strict=True))

        base = by_image(baseline)
        sign = 1.0 if area == "insertion" else -1.0
        out = []
        for m in self.methods:
            if m == baseline:
                continue
            mine = by_image(m)
            shared = [i for i in mine if i in base]
            d = np.array([mine[i] - base[i] for i in shared], dtype=np.float64)
            mean, se = _mean_se(d)
            better, worse = int(np.sum(sign * d > tolerance)), int(np.sum(sign * d < -tolerance))
            n = int(d.size)
            shares = (better / n, (n - better - worse) / n, worse / n) if n else (math.nan,) * 3
            out.append(Versus(m, baseline, area, n, mean, se, *shares, float(tolerance), sign_test(better, worse)))
        return out

    def mean_curves(self) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per method: ``(fractions, mean deletion curve, mean insertion curve)``, each ``(21,)``.

        Images whose curves have other fractions (another grid) are averaged point by
        point all the same; the fractions returned are their mean.
        """
        out = {}
        for m in self.methods:
            t = self.method_rows(m)
            stack = [
                np.array(t.column(c).to_pylist(), dtype=np.float64)
                for c in ("fractions", "deletion_curve", "insertion_curve")
            ]
            out[m] = tuple(s.mean(axis=0) for s in stack)
        return out

    def head_stats(self, what: str = "distance") -> np.ndarray:
        """``(images, blocks, heads)`` float64 of ``head_distance`` or ``head_entropy`` (NaN where absent).

        Images are those of :meth:`images`; images of another depth or width are padded with NaN.
        """
        if what not in ("distance", "entropy"):
            raise ValueError(f"what must be 'distance' or 'entropy', got {what!r}")
        nested = self.images().column(f"head_{what}").to_pylist()
        if not nested:
            return np.zeros((0, 0, 0))
        depth = max(len(t) for t in nested)
        width = max((len(r) for t in nested for r in t), default=0)
        out = np.full((len(nested), depth, width), np.nan)
        for i, t in enumerate(nested):
            for b, row in enumerate(t):
                out[i, b, : len(row)] = [np.nan if v is None else v for v in row]
        return out


MAX_HEADER_DEPTH = 4  # meta -> settings -> labels -> a label; meta -> skipped -> an entry -> its reason
_TEXT_LISTS = ("methods", "labels")


def header_problem(meta: Any) -> str | None:
    """Why a parsed ``vitviz`` header is not one :func:`write_results` writes (None when it is).

    The fields the app reads have the shapes the module docstring gives (``methods`` and ``labels``
    lists of texts, ``skipped`` a list of ``{"where", "reason"}`` tables, ``skipped_total`` a count), and
    nothing nests deeper than :data:`MAX_HEADER_DEPTH` (checked without recursion).
    """
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        return "not a results header"
    level, depth = [meta], 1
    while level:
        inner = [v for x in level for v in (x.values() if isinstance(x, dict) else x) if isinstance(v, (dict, list))]
        if inner and depth >= MAX_HEADER_DEPTH:
            return f"nested deeper than {MAX_HEADER_DEPTH} levels"
        level, depth = inner, depth + 1
    for key in _TEXT_LISTS:
        value = meta.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            return f"'{key}' is not a list of texts"
    skipped = meta.get("skipped", [])
    if not isinstance(skipped, list) or not all(isinstance(s, dict) for s in skipped):
        return "'skipped' is not a list of tables"
    total = meta.get("skipped_total", len(skipped))
    if isinstance(total, bool) or not isinstance(total, int) or total < len(skipped):
        return "'skipped_total' is not a count"
    return None


def _describe(source: Any) -> str:
    return f"'{source}'" if isinstance(source, (str, Path)) else "the uploaded file"


def read_results(source: str | Path | bytes | IO[bytes], limits: ResultsLimits | None = None) -> Results:
    """Read a results file (path, bytes or binary file object), or raise :class:`ResultsError` saying why not.

    Refuses missing files, folders, files that are not Parquet, Parquet files without
    the ``vitviz`` metadata (not made by ``python -m vitviz evaluate``), files of a
    newer schema version, files that lack columns, and files larger than ``limits``
    (:class:`ResultsLimits`; the defaults when None), checked from the footer before any
    column is decoded.
    """
    limits = limits or ResultsLimits()
    name = _describe(source)
    if isinstance(source, (str, Path)):
        p = Path(source)
        if not p.exists():
            raise ResultsError(f"{name} does not exist")
        if p.is_dir():
            raise ResultsError(f"{name} is a folder; give the .parquet file written by `python -m vitviz evaluate`")
        handle: Any = str(p)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        handle = pa.BufferReader(bytes(source))
    else:
        handle = io.BytesIO(source.read())
    try:
        pf = pq.ParquetFile(
            handle,
            thrift_string_size_limit=min(limits.max_bytes, 64 * 2**20),
            thrift_container_size_limit=max(limits.max_columns, 1024) * 64,
        )
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ResultsError(
            f"{name} is not a Parquet file ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
            "vitviz results are written by `python -m vitviz evaluate --out RESULTS.parquet`"
        ) from None
    meta_raw = (pf.schema_arrow.metadata or {}).get(META_KEY)
    if meta_raw is None:
        raise ResultsError(
            f"{name} is a Parquet file but not vitviz evaluation results (it has no 'vitviz' metadata; columns: "
            f"{', '.join(pf.schema_arrow.names[:8])}{', ...' if len(pf.schema_arrow.names) > 8 else ''}). "
            "Make one with `python -m vitviz evaluate`."
        )
    try:
        meta = json.loads(meta_raw)  # RecursionError for JSON nested thousands deep (issue 33.12)
        problem = header_problem(meta)
        if problem:
            raise ValueError(problem)
        version = int(meta["schema_version"])
    except (ValueError, KeyError, TypeError, RecursionError):
        raise ResultsError(f"{name} has 'vitviz' metadata that is not a results header: it cannot be read") from None
    if version > SCHEMA_VERSION:
        raise ResultsError(
            f"{name} was written with results schema version {version}; this vitviz reads up to "
            f"{SCHEMA_VERSION}: update vitviz"
        )
    missing = [c for c in SCHEMA.names if c not in pf.schema_arrow.names]
    if missing:
        raise ResultsError(f"{name} lacks the column(s) {', '.join(missing)}: it is not a complete results file")
    _check_footer(pf, name, limits)
    try:  # strings as stored (dictionaries): a repeated text is expanded only after its size is checked
        strings = pq.ParquetFile(handle, metadata=pf.metadata, read_dictionary=_STRINGS)
        table = _expand_strings(strings.read(columns=SCHEMA.names), name, limits)
    except (pa.ArrowException, OSError) as exc:
        raise ResultsError(f"{name} is damaged: {str(exc).splitlines()[0]}") from None
    return Results(table=table, meta=meta, path=str(source) if isinstance(source, (str, Path)) else None)


def _last_run_file() -> Path:
    home = os.environ.get("VITVIZ_HOME") or Path.home() / ".cache" / "vitviz"
    return Path(home) / "last_results.txt"


def remember_last_run(path: str | Path) -> None:
    """Note ``path`` as the last local run, for the app's Data set page (best effort: never fails a run)."""
    try:
        f = _last_run_file()
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(str(Path(path).resolve()))
    except OSError:
        pass


def last_run() -> Path | None:
    """The results file of the last local ``evaluate`` run (``$VITVIZ_HOME/last_results.txt``), if it still exists."""
    try:
        path = Path(_last_run_file().read_text().strip())
    except (OSError, ValueError):
        return None
    return path if path.is_file() else None
