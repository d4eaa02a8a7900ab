"""Tables for download: named columns in, CSV bytes out (a header row, one row per value); no Streamlit.

Every CSV the app offers goes through :func:`csv_bytes`: the header names each column with its
unit ("mean attention distance (px)", "probability of 'cat'"), and an array on a grid is written
long (one row per cell, its indices in columns of their own) by :func:`long_table`.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["long_table", "csv_bytes"]


def long_table(array: np.ndarray, dims: Sequence[str], value: str) -> dict[str, np.ndarray]:
    """An N-D ``array`` as columns: one integer column per axis (named ``dims``), then ``value``.

    Rows run in C order, so the last axis varies fastest: a ``(gh, gw)`` map gives ``row, col, value``.
    """
    array = np.asarray(array)
    if len(dims) != array.ndim:
        raise ValueError(f"{array.ndim}-D array needs {array.ndim} axis names, got {list(dims)}")
    index = np.indices(array.shape).reshape(array.ndim, -1)
    return {**{d: index[k] for k, d in enumerate(dims)}, value: array.reshape(-1)}


def _cell(v) -> str:
    if isinstance(v, (float, np.floating)):
        return "" if np.isnan(v) else f"{float(v):.6g}"
    if isinstance(v, (bool, np.bool_)):
        return str(bool(v)).lower()
    return str(v)


def csv_bytes(columns: Mapping[str, Sequence | np.ndarray]) -> bytes:
    """Columns of equal length as CSV (UTF-8): a header row of the names, then the values.

    Floats are written with 6 significant digits, NaN as an empty cell; names and strings are
    quoted where they hold a comma.
    """
    if not columns:
        raise ValueError("a table needs at least one column")
    cols = {name: np.asarray(values).reshape(-1) for name, values in columns.items()}
    lengths = {name: len(v) for name, v in cols.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"columns differ in length: {lengths}")
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(cols)
    for row in zip(*cols.values(), strict=True):
        writer.writerow([_cell(v) for v in row])
    return buf.getvalue().encode()
