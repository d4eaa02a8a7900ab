"""Fixtures of the method tests: one thread per test module, tiny hierarchical models loaded once."""

from __future__ import annotations

import pytest
from conftest import HIER_KEYS

from vitviz.models.load import load_model


@pytest.fixture(scope="module", autouse=True)
def _one_thread(one_thread):
    """Every module of this directory runs with one intra-op thread (``one_thread`` in tests/conftest.py)."""


@pytest.fixture(scope="session")
def hier_models(hier_dirs):
    """Every tiny hierarchical family, loaded through vitviz (conftest gives MobileViTs live weights)."""
    return {k: load_model(str(hier_dirs[k]), device="cpu") for k in HIER_KEYS}
