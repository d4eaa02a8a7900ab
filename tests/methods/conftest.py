"""Fixtures of the method tests: one thread per test module, tiny hierarchical models loaded once."""

from __future__ import annotations

import pytest
import torch
from conftest import HIER_KEYS

from vitviz.models.load import load_model


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The machine is shared: a single intra-op thread keeps these tiny forwards fast and steady."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def hier_models(hier_dirs):
    """Every tiny hierarchical family, loaded through vitviz (conftest gives MobileViTs live weights)."""
    return {k: load_model(str(hier_dirs[k]), device="cpu") for k in HIER_KEYS}
