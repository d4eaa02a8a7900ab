"""CSV downloads: a header row, every column, values read back as written (the csv module as reference)."""

import csv
import io

import numpy as np
import pytest

from vitviz.tables import csv_bytes, long_table


def _read(data: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(data.decode())))


def test_a_map_is_written_long_with_its_indices_and_a_header():
    values = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    rows = _read(csv_bytes(long_table(values, ("row", "col"), "attention weight (raw)")))
    assert rows[0] == ["row", "col", "attention weight (raw)"]
    assert len(rows) == 1 + 6
    for r, c, v in rows[1:]:
        assert float(v) == pytest.approx(values[int(r), int(c)], rel=1e-5)
    assert rows[1][:2] == ["0", "0"] and rows[2][:2] == ["0", "1"]  # the last axis fastest


def test_every_column_is_kept_names_with_commas_are_quoted_and_nan_is_empty():
    data = csv_bytes({"fraction of patches": [0.0, 0.5], "rollout, deletion (probability)": [0.9, np.nan]})
    rows = _read(data)
    assert rows == [["fraction of patches", "rollout, deletion (probability)"], ["0", "0.9"], ["0.5", ""]]


def test_bad_tables_are_refused():
    with pytest.raises(ValueError, match="differ in length"):
        csv_bytes({"a": [1, 2], "b": [1]})
    with pytest.raises(ValueError, match="axis names"):
        long_table(np.zeros((2, 2)), ("row",), "v")
    with pytest.raises(ValueError):
        csv_bytes({})
