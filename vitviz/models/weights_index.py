"""A sharded checkpoint's weights index (``model.safetensors.index.json``) may name only the folder's own files.

``transformers`` opens whatever file each ``weight_map`` entry names, relative to the
folder: ``../other-model/model.safetensors`` or an absolute path would load another
model's weights (another cached hub model, a file of the server). Used for local folders
(:func:`vitviz.models.load.load_model`) and typed hub ids (:mod:`vitviz.serve.hub_checks`).
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath

__all__ = ["INDEX", "index_problem"]

INDEX = "model.safetensors.index.json"


def index_problem(index_text: str, files: set[str]) -> str | None:
    """Why a weights index is refused (None when every entry is one of ``files``, the repository's top level)."""
    try:
        index = json.loads(index_text)
    except ValueError:
        return "that is not valid JSON"
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        return "without a weight_map"
    for target in weight_map.values():
        if not isinstance(target, str):
            return "with an entry that is not a file name"
        path = PurePosixPath(target.replace("\\", "/"))
        if path.is_absolute() or ".." in path.parts or len(path.parts) != 1 or target.startswith("~"):
            return "that names files outside the repository"
        if target not in files:
            return "that names files the repository does not have"
    return None
