"""Faithfulness over a whole data set: ``python -m vitviz evaluate``, resumable, with a local or a Ray engine.

:func:`evaluate_dataset` lists the data set (:mod:`vitviz.evaluate.data`), skips the
images a previous run of the same settings already finished, hands the others to an
engine, and assembles ONE results file (:mod:`vitviz.evaluate.results`).

Per image (:meth:`Evaluator.evaluate_image`, the same code in both engines): one
capture (its blocks give the per-head distance and entropy), the top-1 class, every
method's map for that class (one capture shared, as
:func:`vitviz.methods.explain_many`), and the deletion / insertion curves of all maps
forwarded together (:class:`~vitviz.evaluate.faithfulness.Perturbations`): the numbers
of :func:`~vitviz.evaluate.faithfulness.evaluate_methods`, with the random map seeded
per image (:func:`~vitviz.evaluate.results.image_seed`).

**Resumable layout.** Beside ``--out RESULTS.parquet`` a hidden work folder
``.RESULTS.parquet.vitviz-work/`` holds:

* ``run.json``: the settings (model, methods, size, seed, data set); a later run with
  other settings refuses to mix its rows in and says so;
* ``parts/part-<time>-<random>.parquet``: the rows of a chunk of finished images (every
  method of each), written to a hidden temporary name and renamed, so a part is
  either complete or absent: an interrupted run never leaves a half row, and loses at
  most the images of the chunk in flight (at most ``chunk_images`` images or
  ``chunk_seconds`` of work).

A rerun lists the image ids in the parts and evaluates only the others. At the end
the parts are assembled (in data set order, one row per image and method, no
duplicates) into ``RESULTS.parquet``, again by temporary file and rename. The work
folder is then removed when every image was evaluated, and kept when some were
skipped (so a rerun after fixing them evaluates only those). The engine does not
matter to the layout: a run started with one engine can be finished with the other.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from vitviz.capture.targets import Target
from vitviz.errors import CaptureError
from vitviz.evaluate.data import MAX_FILES, MAX_ROWS, Dataset, Item, SkipLog, read_dataset
from vitviz.evaluate.faithfulness import DEFAULT_INSERTION_START, INSERTION_STARTS
from vitviz.evaluate.results import (
    SCHEMA,
    SCHEMA_VERSION,
    rows_to_table,
    run_metadata,
    write_results,
    write_table_atomic,
)
from vitviz.evaluate.worker import EvaluateError, Evaluator, RunConfig, failure
from vitviz.methods import available_methods, get_method, why_unavailable
from vitviz.methods.base import Inputs, MethodError
from vitviz.models.load import LoadedModel, load_model
from vitviz.models.zeroshot import Labels, parse_labels, vocabulary_warning

__all__ = [
    "ENGINES",
    "EvaluateError",
    "RunConfig",
    "Evaluator",
    "WorkDir",
    "PartWriter",
    "RunReport",
    "resolve_methods",
    "evaluate_dataset",
    "print_report",
]

ENGINES = ("local", "ray")
Progress = Callable[[int, int], None]  # (images finished, skipped included, previous runs included; images in all)


def resolve_methods(
    loaded: LoadedModel, methods: Sequence[str] | None, labels: Labels | None = None
) -> tuple[str, ...]:
    """The methods to run: all that apply (None) or those named, each checked (for a label of ``labels``, a
    zero-shot model's classes); :class:`MethodError` says why not."""
    target = None if labels is None else Target.of_label(labels, 0)
    if target is None and not loaded.has_classifier and loaded.zero_shot:
        raise EvaluateError(
            f"'{loaded.name}' is a zero-shot model: give the labels to score each image against with --labels "
            '(e.g. --labels "cat,dog,car"), optionally with --template'
        )
    if target is None and not loaded.has_classifier and loaded.text_note:
        raise EvaluateError(loaded.text_note)
    if target is None and not loaded.has_classifier:
        raise EvaluateError(
            f"'{loaded.name}' is a backbone without a classifier: deletion and insertion score class "
            "probabilities, so evaluate needs a classification model"
        )
    if methods is None:
        return available_methods(loaded, target)
    names = []
    for m in methods:
        name = get_method(m).name
        why = why_unavailable(loaded, name, target)
        if why:
            raise MethodError(why)
        if name not in names:
            names.append(name)
    if not names:
        raise EvaluateError("no method given: name at least one with --methods")
    return tuple(names)


# --- the work folder -------------------------------------------------------------------


class WorkDir:
    """The hidden work folder of one ``--out`` (module docstring, "Resumable layout")."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.root = self.out.parent / f".{self.out.name}.vitviz-work"
        self.parts = self.root / "parts"
        self.notes: list[str] = []

    def open(self, settings: dict) -> None:
        """Create the folder, or check that the run in it had the same ``settings``."""
        run_json = self.root / "run.json"
        if run_json.is_file():
            try:
                before = json.loads(run_json.read_text())
            except (OSError, ValueError):
                before = None
            if before != settings:
                diff = (
                    "its run.json is unreadable"
                    if not isinstance(before, dict)
                    else "; ".join(
                        f"{k}: {before.get(k)!r} then, {settings.get(k)!r} now"
                        for k in settings
                        if before.get(k) != settings.get(k)
                    )
                )
                raise EvaluateError(
                    f"'{self.root}' holds an unfinished run with other settings ({diff}). Rerun with the same "
                    "settings to finish it, or delete that folder to start over."
                )
        self.parts.mkdir(parents=True, exist_ok=True)
        if not run_json.is_file():
            tmp = self.root / f".run.json.{uuid.uuid4().hex[:8]}.tmp"
            tmp.write_text(json.dumps(settings, indent=1))
            os.replace(tmp, run_json)

    def part_files(self) -> list[Path]:
        """Finished parts (temporary files of an interrupted write are not parts)."""
        if not self.parts.is_dir():
            return []
        return sorted(p for p in self.parts.glob("part-*.parquet") if p.is_file())

    def read_parts(self) -> pa.Table:
        """Every row written so far (a part that cannot be read is noted and left out: its images are redone)."""
        tables = []
        for p in self.part_files():
            try:
                t = pq.read_table(p)
                tables.append(t.select(SCHEMA.names).cast(SCHEMA))
            except (pa.ArrowException, OSError, KeyError, ValueError) as exc:
                self.notes.append(f"{p.name} is unreadable and was left out ({str(exc).splitlines()[0]})")
        return pa.concat_tables(tables) if tables else SCHEMA.empty_table()

    def done_ids(self) -> set[str]:
        return set(self.read_parts().column("image_id").to_pylist())

    def write_part(self, rows: Sequence[dict]) -> Path:
        name = f"part-{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.parquet"
        return write_table_atomic(rows_to_table(rows), self.parts / name)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class PartWriter:
    """Collects the rows of finished images and writes them as parts: every ``chunk_images`` images or
    ``chunk_seconds`` seconds, and at :meth:`flush` (always called when a run stops, however it stops)."""

    def __init__(self, work: WorkDir, *, chunk_images: int = 32, chunk_seconds: float = 60.0) -> None:
        self.work, self.chunk_images, self.chunk_seconds = work, max(1, chunk_images), chunk_seconds
        self._rows: list[dict] = []
        self._images = 0
        self._since = time.monotonic()
        self.written = 0  # images written by this writer

    def add(self, rows: Sequence[dict]) -> None:
        """The rows of one finished image (all its methods)."""
        self._rows.extend(rows)
        self._images += 1
        if self._images >= self.chunk_images or time.monotonic() - self._since >= self.chunk_seconds:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            self.work.write_part(self._rows)
            self.written += self._images
        self._rows, self._images, self._since = [], 0, time.monotonic()


# --- the run ---------------------------------------------------------------------------


@dataclass
class RunReport:
    """What a run did. ``evaluated``: images in the results file; ``new``: of those, evaluated by this run;
    ``skipped``: what was not evaluated (listing and per-image failures), with reasons: the first
    :data:`~vitviz.evaluate.data.KEPT_SKIPPED` kept, ``skipped.total`` counting all."""

    out: Path
    listed: int
    evaluated: int
    new: int
    skipped: SkipLog = field(default_factory=SkipLog)
    methods: tuple[str, ...] = ()
    engine: str = "local"
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    work_kept: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.skipped


def _settings(config: RunConfig, dataset: Dataset) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "model": config.model,
        "methods": list(config.methods),
        "size": config.to_dict()["size"],
        "seed": config.seed,
        "insertion_start": config.insertion_start,
        "data": str(dataset.source.resolve()),
        **({"relevance_from_block": config.relevance_from_block} if config.relevance_from_block else {}),
        **({"labels": list(config.labels), "template": config.template} if config.labels else {}),
    }


_COMPARED = ("model", "methods", "size", "seed")  # what a results file written before `settings` existed says


def _refuse_other_results(out: Path, settings: dict) -> None:
    """Refuse to replace a finished results file ``out`` written with other settings (or not by vitviz)."""
    if not out.exists():
        return
    from vitviz.evaluate.results import META_KEY

    try:
        meta = json.loads((pq.read_schema(out).metadata or {})[META_KEY])
    except (OSError, KeyError, ValueError, TypeError, pa.ArrowException):
        meta = None
    if not isinstance(meta, dict):
        raise EvaluateError(
            f"--out '{out}' exists and is not vitviz results; choose another --out, or add --overwrite to replace it."
        )
    before = meta.get("settings")
    if not isinstance(before, dict):  # older files: the fields they have
        before = {**settings, "model": meta.get("model_source"), "methods": meta.get("methods")}
        before.update({k: meta.get(k) for k in ("size", "seed")})
    keys = [k for k in settings if k != "schema_version"]
    diff = [f"{k}: {before.get(k)!r} then, {settings[k]!r} now" for k in keys if before.get(k) != settings[k]]
    if diff:
        raise EvaluateError(
            f"--out '{out}' holds finished results of other settings ({'; '.join(diff)}). Choose another --out, "
            "or add --overwrite to replace them."
        )


def _assemble(work: WorkDir, dataset: Dataset, config: RunConfig, meta: dict) -> int:
    """Write the results file from the parts: data set order, method order, one row per (image, method)."""
    table = work.read_parts()
    position = {item.image_id: i for i, item in enumerate(dataset.items)}
    method_rank = {m: i for i, m in enumerate(config.methods)}
    rows = table.to_pylist()
    best: dict[tuple[str, str], dict] = {}
    for r in rows:
        if r["image_id"] in position and r["method"] in method_rank:
            best.setdefault((r["image_id"], r["method"]), r)
    per_image: dict[str, int] = {}
    for image_id, _ in best:
        per_image[image_id] = per_image.get(image_id, 0) + 1
    complete = {i for i, n in per_image.items() if n == len(config.methods)}
    kept = sorted(
        (r for (i, _), r in best.items() if i in complete),
        key=lambda r: (position[r["image_id"]], method_rank[r["method"]]),
    )
    write_results(rows_to_table(kept), work.out, {**meta, "images": len(complete)})
    return len(complete)


def evaluate_dataset(
    model: str,
    data: str | Path,
    out: str | Path,
    *,
    methods: Sequence[str] | None = None,
    limit: int | None = None,
    max_rows: int = MAX_ROWS,
    max_files: int = MAX_FILES,
    size: int | tuple[int, int] | None = None,
    seed: int = 0,
    engine: str = "local",
    address: str | None = None,
    batch_size: int = 20,
    device: str | None = None,
    progress: Progress | None = None,
    chunk_images: int = 32,
    chunk_seconds: float = 60.0,
    loaded: LoadedModel | None = None,
    ray_actors: int | None = None,
    insertion_start: str = DEFAULT_INSERTION_START,
    relevance_from_block: int = 0,
    labels: str | None = None,
    template: str | None = None,
    overwrite: bool = False,
) -> RunReport:
    """Evaluate every image of ``data`` (folder or CSV) with ``methods`` and write ``out`` (module docstring).

    ``engine``: ``local`` (this process, no Ray imported) or ``ray`` (``address``: an
    existing cluster, default a local one; ``ray_actors``: the actor pool size,
    default one per GPU, else one per CPU). ``progress(done, total)`` after each image.
    An existing ``out`` (finished results) or unfinished work of other settings is refused
    unless ``overwrite``; with the same settings the run resumes (or is redone) as before.
    ``loaded``: a model already loaded by ``model`` (the local engine uses it; saves a
    load in tests). Raises :class:`EvaluateError`, :class:`~vitviz.evaluate.data.DataError`,
    :class:`~vitviz.methods.base.MethodError` or a model loading error before any image
    when the run cannot start; images that fail are skipped and reported.
    """
    t0 = time.perf_counter()
    if engine not in ENGINES:
        raise EvaluateError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if address is not None and engine != "ray":
        raise EvaluateError("--address connects to a Ray cluster: use it with --engine ray")
    if batch_size < 1:
        raise EvaluateError(f"--batch-size must be at least 1, got {batch_size}")
    if ray_actors is not None and ray_actors < 1:
        raise EvaluateError(f"--actors must be at least 1, got {ray_actors}")
    if insertion_start not in INSERTION_STARTS:
        raise EvaluateError(f"unknown insertion start {insertion_start!r}; choose one of {', '.join(INSERTION_STARTS)}")
    out = Path(out)
    if out.is_dir():
        raise EvaluateError(f"--out '{out}' is a folder; give a file name such as results.parquet")
    from vitviz.cli_checks import check_output_folder

    check_output_folder(out.parent, "--out's folder")  # writable (created if missing) before any work
    dataset = read_dataset(data, limit=limit, max_rows=max_rows, max_files=max_files)
    if loaded is None:
        loaded = load_model(model, device=device)
    if size is not None:
        from vitviz.cli_checks import check_against_model

        check_against_model(loaded, size, None)  # at least one patch per side
    label_set, notes = None, []
    if labels is not None:
        if loaded.text is None:
            raise EvaluateError(
                loaded.text_note
                or f"'{loaded.name}' has no text tower: --labels needs a CLIP- or SigLIP-style two-tower checkpoint"
            )
        label_set = parse_labels(labels, template if template is not None else loaded.text.template)
        notes = [*label_set.notes, vocabulary_warning(loaded.text, label_set, loaded.name)]
    config = RunConfig(
        model=model,
        methods=resolve_methods(loaded, methods, label_set),
        size=size,
        seed=seed,
        batch_size=batch_size,
        device=device,
        insertion_start=insertion_start,
        relevance_from_block=relevance_from_block,
        labels=label_set.names if label_set else (),
        template=label_set.template if label_set else "{}",
    )
    if relevance_from_block and "relevance" in config.methods:
        from vitviz.capture.gradients import start_block_index

        try:  # a block the model does not have is refused before any image
            blocks = Inputs(loaded, Image.new("RGB", (8, 8)), size=size).capture.blocks
            start_block_index([b.geometry for b in blocks], relevance_from_block)
        except CaptureError as exc:
            raise EvaluateError(str(exc)) from None
    work = WorkDir(out)
    work.notes.extend(n for n in notes if n)
    settings = _settings(config, dataset)
    if overwrite:
        work.remove()  # unfinished work of other settings goes; the results file is replaced at the end
    else:
        _refuse_other_results(out, settings)
    work.open(settings)
    done = work.done_ids()
    todo = [item for item in dataset.items if item.image_id not in done]
    total = len(dataset.items)
    finished = total - len(todo)
    skipped = SkipLog()  # images that failed: counted, the first ones kept with their reasons
    writer = PartWriter(work, chunk_images=chunk_images, chunk_seconds=chunk_seconds)

    def finish(n: int = 1) -> None:
        nonlocal finished
        finished += n
        if progress is not None:
            progress(finished, total)

    if progress is not None:
        progress(finished, total)
    try:
        if engine == "local":
            _run_local(Evaluator(config, loaded), todo, writer, skipped, finish)
        elif todo:
            from vitviz.evaluate.ray_engine import run_ray

            run_ray(config, todo, writer, skipped, finish, address=address, actors=ray_actors)
    finally:
        writer.flush()
    all_skipped = SkipLog(dataset.skipped)
    all_skipped.extend(skipped)
    meta = run_metadata(
        model=loaded.name,
        model_source=model,
        methods=list(config.methods),
        seed=seed,
        size=config.to_dict()["size"],
        data=str(dataset.source),
        engine=engine,
        relevance_from_block=relevance_from_block,
        **({"labels": list(config.labels), "template": config.template} if config.labels else {}),
        points=21,
        insertion_start=insertion_start,
        skipped=[{"where": s.where, "reason": s.reason} for s in all_skipped],  # the first ones, with reasons
        skipped_total=all_skipped.total,
        settings=settings,
    )
    evaluated = _assemble(work, dataset, config, meta)
    kept = None
    if all_skipped or evaluated < total:
        kept = work.root
    else:
        work.remove()
    return RunReport(
        out=out,
        listed=total + dataset.skipped.total,
        evaluated=evaluated,
        new=writer.written,
        skipped=all_skipped,
        methods=config.methods,
        engine=engine,
        seconds=time.perf_counter() - t0,
        notes=work.notes,
        work_kept=kept,
    )


def _run_local(
    evaluator: Evaluator,
    todo: Sequence[Item],
    writer: PartWriter,
    skipped: SkipLog,
    finish: Callable[[int], None],
) -> None:
    """The local engine: one image after the other in this process."""
    for item in todo:
        try:
            rows = evaluator.evaluate_item(item)
        except Exception as exc:  # one bad image must not stop the run; it is reported
            skipped.append(failure(item, exc))
        else:
            writer.add(rows)
        finish(1)


MAX_LISTED = 20  # skipped images printed one by one; the rest are counted (the first 100 are in the file's metadata)


def print_report(report: RunReport) -> None:
    """What the command prints: the summary table on stdout; notes and skipped images, counted, on stderr."""
    from vitviz.cli_checks import terminal_text
    from vitviz.evaluate.results import read_results

    resumed = report.evaluated - report.new

    def plural(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    def pm(mean: float, se: float) -> str:
        return f"{mean:.4f} +- {se:.4f}" if se == se else f"{mean:.4f}          "  # no SE from one image

    print(
        f"wrote {plural(report.evaluated, 'image')} x {plural(len(report.methods), 'method')} to "
        f"{terminal_text(report.out)} "
        f"({report.new} evaluated now{f', {resumed} from an earlier run' if resumed > 0 else ''}; "
        f"{report.engine} engine, {report.seconds:.0f} s)"
    )
    if report.evaluated:
        res = read_results(report.out)
        rows = res.summary()
        print(f"{'method':<22}{'deletion (lower better)':>26}{'insertion (higher better)':>28}{'peak in box':>14}")
        for r in rows:
            peak = "-" if r.peak_in_box_rate is None else f"{100 * r.peak_in_box_rate:.1f} %"
            print(
                f"{r.method:<22}{pm(r.deletion_mean, r.deletion_se):>26}{pm(r.insertion_mean, r.insertion_se):>28}"
                f"{peak:>14}"
            )
        ins, dele = res.versus("random", "insertion"), res.versus("random", "deletion")
        if ins:  # both readings of "better than random": by how much (mean difference) and how often (shares)
            tol = ins[0].tolerance
            print(
                f"against random, image by image: mean area difference; share of images better / within {tol:g} "
                "/ worse than random; sign test p"
            )
            print(f"{'method':<22}{'deletion - random':>26}{'lower / tie / higher':>24}{'p':>9}", end="")
            print(f"{'insertion - random':>26}{'higher / tie / lower':>24}{'p':>9}")

            def shares(v) -> str:
                return f"{100 * v.better_share:.0f} / {100 * v.tie_share:.0f} / {100 * v.worse_share:.0f} %"

            for i, d in zip(ins, dele, strict=True):
                print(
                    f"{i.method:<22}{pm(d.difference_mean, d.difference_se):>26}{shares(d):>24}{d.sign_p:>9.2g}"
                    f"{pm(i.difference_mean, i.difference_se):>26}{shares(i):>24}{i.sign_p:>9.2g}"
                )
    for note in report.notes:  # notes and reasons quote labels and CSV cells: printed with control characters escaped
        print(f"note: {terminal_text(note)}", file=sys.stderr)
    if report.skipped:
        n = getattr(report.skipped, "total", len(report.skipped))
        print(f"skipped {n} of {plural(report.listed, 'image')} (the others' results are kept):", file=sys.stderr)
        shown = report.skipped[:MAX_LISTED]
        for s in shown + [s for s in getattr(report.skipped, "noted", []) if s not in shown]:  # "the rest not read"
            print(f"error: {terminal_text(s)}", file=sys.stderr)
        if n > MAX_LISTED:
            kept = min(len(report.skipped), n)
            print(
                f"... and {n - MAX_LISTED:,} more (the first {kept:,} are listed with their reasons in the results "
                "file's metadata, key 'vitviz'; 'skipped_total' counts them all)",
                file=sys.stderr,
            )
        if report.work_kept is not None:
            print(
                f"note: rerun the same command to retry them; finished images are kept in "
                f"{terminal_text(report.work_kept)}",
                file=sys.stderr,
            )
