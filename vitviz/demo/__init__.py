"""Training and scoring of the bundled demo models, and where they live.

Each bundled model is a folder written by ``save_pretrained`` (safetensors) under
``vitviz/assets``, loaded by a short name like any hub checkpoint (the table is
:mod:`vitviz.models.bundled`, re-exported here).
"""

from vitviz.models.bundled import ASSETS, BUNDLED, bundled

__all__ = ["ASSETS", "BUNDLED", "bundled"]
