"""The bundled demo SAE (``vitviz/assets/demo-sae``): ``python -m vitviz sae train-demo`` rebuilds it bit for bit.

It is :func:`vitviz.sae.train.train` with the fixed settings :data:`DEMO_SETTINGS` on ``demo-data`` images
(``write_dataset(n=2000, seed=2)``: sample ids ``2 * 1_000_003 + i``, which neither the demo ViT's training set
(seed 0) nor its held-out set (seed 1) uses), read by the bundled ``demo`` ViT at ``blocks.2.out``, on one CPU
thread (``torch.set_num_threads(1)`` for the run, so the float sums come out in one order). Beside the weights:
``metrics.json`` (:mod:`vitviz.sae.measure`, on the 100 held-out images of the split) and ``ground_truth.json``
(:func:`vitviz.sae.ground_truth.shape_auroc` on :data:`GROUND_TRUTH_IMAGES` images with ids
``3 * 1_000_003 + i``, never seen by the ViT or the SAE).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from vitviz.sae.ground_truth import ShapeScore, shape_auroc
from vitviz.sae.load import load_sae
from vitviz.sae.model import CFG_FILE, WEIGHTS_FILE, save_sae
from vitviz.sae.train import TrainSettings, train

__all__ = [
    "DEMO_SAE_DIR",
    "DEMO_POINT",
    "DEMO_DATA",
    "DEMO_SETTINGS",
    "GROUND_TRUTH_IMAGES",
    "GROUND_TRUTH_FILE",
    "ground_truth_seeds",
    "DemoSAE",
    "train_demo_sae",
    "read_ground_truth",
    "DEMO_INDEX",
    "DEMO_INDEX_DATA",
    "DEMO_INDEX_COMMAND",
    "index_demo_sae",
]

DEMO_SAE_DIR = Path(__file__).resolve().parents[1] / "assets" / "demo-sae"
DEMO_POINT = "blocks.2.out"
DEMO_DATA = {"n": 2000, "seed": 2}  # python -m vitviz demo-data --n 2000 --seed 2
# The bundled feature index of the demo SAE: its images beside it (ids 4 * 1_000_003 + i, a seed no other demo set
# uses), its example paths relative to its folder.
DEMO_INDEX_DIR = DEMO_SAE_DIR.parent / "demo-sae-index"
DEMO_INDEX = DEMO_INDEX_DIR / "index.parquet"
DEMO_INDEX_DATA = {"n": 200, "seed": 4}
DEMO_INDEX_COMMAND = f"python -m vitviz demo-data --n {DEMO_INDEX_DATA['n']} --seed {DEMO_INDEX_DATA['seed']}"
GROUND_TRUTH_IMAGES = 500
GROUND_TRUTH_SEED = 3
GROUND_TRUTH_FILE = "ground_truth.json"
DEMO_SETTINGS = dict(
    model="demo",
    point=DEMO_POINT,
    width="8x",  # 768 features on the demo's 96-wide residual stream
    k=16,
    tokens="patches",
    seed=0,
    steps=1000,
    batch_tokens=2048,
    lr=4e-4,
    held_out=100,
)


def ground_truth_seeds(n: int = GROUND_TRUTH_IMAGES) -> list[int]:
    """The sample ids of the ground-truth images: ``3 * 1_000_003 + i``, i < n."""
    return [GROUND_TRUTH_SEED * 1_000_003 + i for i in range(n)]


@dataclass(frozen=True)
class DemoSAE:
    out: Path
    scores: list[ShapeScore]
    metrics: dict

    def table(self) -> str:
        """The ground-truth table in Markdown."""
        rows = [
            "| shape | best feature | AUROC | second best | positive patches | negative patches |",
            "|---|---|---|---|---|---|",
        ]
        for s in self.scores:
            rows.append(
                f"| {s.label} | {s.feature} | {s.auroc:.3f} | {s.runner_up:.3f} | {s.positives} | {s.negatives} |"
            )
        return "\n".join(rows)


def train_demo_sae(out: str | Path | None = None, *, progress: Callable | None = None) -> DemoSAE:
    """Rebuild the demo SAE into ``out`` (default: the bundled folder) and measure it (module docstring)."""
    from vitviz.data.shapes import write_dataset
    from vitviz.models.load import load_model

    target = DEMO_SAE_DIR if out is None else Path(out)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loaded = load_model("demo", device="cpu")
        with tempfile.TemporaryDirectory(prefix="vitviz-demo-sae-") as tmp:
            csv = write_dataset(Path(tmp) / "data", **DEMO_DATA)
            settings = TrainSettings(data=str(csv), **DEMO_SETTINGS)
            report = train(settings, Path(tmp) / "sae", loaded=loaded, progress=progress)
            sae = report.sae
            # the record names the data by the command that writes it, not by the temporary folder
            record = {**sae.cfg.training, "data": f"python -m vitviz demo-data --n {DEMO_DATA['n']} --seed 2"}
            sae.cfg = sae.cfg.with_(training=record)
            target.mkdir(parents=True, exist_ok=True)
            save_sae(sae, target)
            shutil.copyfile(Path(tmp) / "sae" / "metrics.json", target / "metrics.json")
        scores = shape_auroc(load_sae(target), loaded, ground_truth_seeds(), progress=progress)
    finally:
        torch.set_num_threads(threads)
    table = {
        "images": GROUND_TRUTH_IMAGES,
        "sample_ids": f"{GROUND_TRUTH_SEED} * 1_000_003 + i, i < {GROUND_TRUTH_IMAGES}",
        "point": DEMO_POINT,
        "positive": "at least half of the patch's pixels on the image's shape",
        "negative": "no pixel of the patch on the shape (every image)",
        "shapes": [asdict(s) for s in scores],
    }
    (target / GROUND_TRUTH_FILE).write_text(json.dumps(table, indent=2) + "\n")
    return DemoSAE(target, scores, report.metrics or {})


# The per-block comparison of docs/sae.md: the demo recipe, smaller (384 features, k = 8, 600 steps), at each block
BLOCK_COMPARISON = dict(width="4x", k=8, steps=600)


def compare_blocks(*, progress: Callable | None = None) -> list[dict]:
    """For each block's output of the demo ViT, an SAE of :data:`BLOCK_COMPARISON` trained like the bundled one and
    its shapes' table: ``[{"point", "shapes": {label: AUROC}, "lowest", "explained_variance"}, ...]``."""
    from vitviz.data.shapes import write_dataset
    from vitviz.models.hooks import installed_points
    from vitviz.models.load import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        loaded = load_model("demo", device="cpu")
        points = [n for n in installed_points(loaded.model).names() if n.startswith("blocks.") and n.endswith(".out")]
        points = [n for n in points if n.count(".") == 2]  # blocks.{i}.out (not attn.out, mlp.out)
        with tempfile.TemporaryDirectory(prefix="vitviz-demo-blocks-") as tmp:
            csv = write_dataset(Path(tmp) / "data", **DEMO_DATA)
            for point in points:
                settings = TrainSettings(data=str(csv), **{**DEMO_SETTINGS, **BLOCK_COMPARISON, "point": point})
                report = train(settings, Path(tmp) / point, loaded=loaded, progress=progress)
                scores = shape_auroc(report.sae, loaded, ground_truth_seeds(), progress=progress)
                rows.append(
                    {
                        "point": point,
                        "shapes": {s.label: s.auroc for s in scores},
                        "lowest": min(s.auroc for s in scores),
                        "explained_variance": (report.metrics or {}).get("explained_variance"),
                    }
                )
    finally:
        torch.set_num_threads(threads)
    return rows


def blocks_table(rows: list[dict]) -> str:
    """:func:`compare_blocks`'s rows in Markdown."""
    labels = list(rows[0]["shapes"]) if rows else []
    out = [
        "| point | " + " | ".join(labels) + " | lowest | explained variance |",
        "|---|" + "---|" * (len(labels) + 2),
    ]
    for r in rows:
        cells = " | ".join(f"{r['shapes'][k]:.3f}" for k in labels)
        out.append(f"| `{r['point']}` | {cells} | {r['lowest']:.3f} | {r['explained_variance']:.3f} |")
    return "\n".join(out)


def read_ground_truth(folder: str | Path = DEMO_SAE_DIR) -> list[ShapeScore]:
    """The shapes' table written beside a demo SAE (empty if there is none)."""
    path = Path(folder) / GROUND_TRUTH_FILE
    if not path.is_file():
        return []
    return [ShapeScore(**s) for s in json.loads(path.read_text())["shapes"]]


def bundled_files() -> tuple[str, ...]:
    return (CFG_FILE, WEIGHTS_FILE, "metrics.json", GROUND_TRUTH_FILE)


def index_demo_sae(out: str | Path | None = None, *, progress: Callable | None = None) -> Path:
    """Rebuild the demo SAE's feature index into the folder ``out`` (default: the bundled
    ``vitviz/assets/demo-sae-index``): :data:`DEMO_INDEX_DATA`'s images in ``images/`` as JPEG (quality 90: 4 KB
    an image where the noisy PNGs take 17; the index reads the JPEGs, so its numbers are theirs), with ``labels.csv``
    and ``index.parquet`` (``vitviz sae index`` on them, top 16 per feature, one CPU thread), made portable: its
    example paths relative to its folder, its header naming the data by the command that writes it. Returns the
    index's path."""
    from vitviz.data.shapes import write_dataset
    from vitviz.models.load import load_model
    from vitviz.sae.index import build_index, make_portable

    target = DEMO_INDEX_DIR if out is None else Path(out)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loaded = load_model("demo", device="cpu")
        sae = load_sae(DEMO_SAE_DIR, loaded=loaded)
        with tempfile.TemporaryDirectory(prefix="vitviz-demo-index-") as tmp:
            csv = _as_jpeg(write_dataset(Path(tmp), **DEMO_INDEX_DATA), target / "images")
        index = target / "index.parquet"
        build_index(sae, loaded, csv, index, model_source="demo", overwrite=True, progress=progress)
    finally:
        torch.set_num_threads(threads)
    make_portable(index, data=DEMO_INDEX_COMMAND, sae_source="the bundled demo SAE")
    return index


def _as_jpeg(csv: Path, folder: Path) -> Path:
    """A copy of the data set of ``csv`` in ``folder``: every image as JPEG (quality 90), the CSV naming them."""
    import csv as csvlib

    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    with csv.open(newline="") as fh:
        rows = list(csvlib.reader(fh))
    for row in rows[1:]:
        name = Path(row[0]).with_suffix(".jpg").name
        Image.open(csv.parent / row[0]).convert("RGB").save(folder / name, "JPEG", quality=90)
        row[0] = name
    out = folder / "labels.csv"
    with out.open("w", newline="") as fh:
        csvlib.writer(fh).writerows(rows)
    return out
