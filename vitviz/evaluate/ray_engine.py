"""The Ray engine of ``python -m vitviz evaluate --engine ray``: the same rows as the local engine, scaled out.

A Ray Data pipeline::

    from_items(images to do)                         the list: id, path, label, box
      -> map_batches(read_images)                    read + decode + check the box (tasks)
      -> map_batches(EvaluateActor,                  a pool of actors, each loading the model
                     compute=ActorPoolStrategy(size=n),   by name once (num_gpus=1 each
                     num_gpus=1 | num_cpus=1)             where the cluster has GPUs)
      -> iter_batches() on the driver                rows stream back, the driver writes
                                                     them as Parquet parts (atomically)

The rows come back to the driver rather than going through ``Dataset.write_parquet``:
on a cluster the workers' disks are not the driver's, and the driver's part writer
gives the same resumable, atomic layout as the local engine
(:mod:`vitviz.evaluate.run`): images already in parts are never sent to the cluster,
each part holds whole images only, and the progress bar counts images as they
arrive. Rows are small (a few kB per image), so the driver is no bottleneck.

``address`` None starts a local Ray with ``num_cpus`` = the cores this process may use;
otherwise ``ray.init(address=...)`` joins that cluster (``"auto"``, ``"ray://host:10001"``);
every node must then see the images at the same paths (a shared file system) and have
vitviz and the model available (``--model`` is loaded by name in each actor). When Ray
is already initialised (a notebook, the tests) that session is used and left running.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from PIL import Image

from vitviz.errors import VitvizError
from vitviz.evaluate.data import Item, Skipped, load_item
from vitviz.evaluate.results import SCHEMA
from vitviz.evaluate.worker import EvaluateError, Evaluator, RunConfig, failure

if TYPE_CHECKING:
    from vitviz.evaluate.run import PartWriter

__all__ = [
    "run_ray",
    "require_ray",
    "read_images",
    "EvaluateActor",
    "available_cores",
    "start_local_ray",
    "RESULT_SCHEMA",
]

RESULT_SCHEMA = SCHEMA.append(pa.field("error", pa.string())).append(pa.field("error_where", pa.string()))
IMAGES_PER_BATCH = 4  # per actor call: small, so work spreads over the actors and rows stream back steadily


def available_cores() -> int:
    """CPU cores this process may use (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _items(batch: pa.Table) -> list[Item]:
    return [Item.from_dict(d) for d in batch.select(["image_id", "path", "label", "box", "source"]).to_pylist()]


def read_images(batch: pa.Table) -> pa.Table:
    """Ray stage 2: read and decode each image (``load_item``: box inside the image), RGB bytes or the error."""
    out = {k: [] for k in ("rgb", "width", "height", "error")}
    for item in _items(batch):
        try:
            image = load_item(item)
        except Exception as exc:  # reported with the image, the run goes on
            out["rgb"].append(None), out["width"].append(None), out["height"].append(None)
            out["error"].append(failure(item, exc).reason)
        else:
            out["rgb"].append(image.tobytes()), out["width"].append(image.width), out["height"].append(image.height)
            out["error"].append(None)
    for name, dtype in (
        ("rgb", pa.large_binary()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("error", pa.string()),
    ):
        batch = batch.append_column(name, pa.array(out[name], type=dtype))
    return batch


def _error_row(item: Item, message: str) -> dict:
    where = failure(item, VitvizError(message)).where
    return {"image_id": item.image_id, "path": item.path, "error": message, "error_where": where}


class EvaluateActor:
    """Ray stage 3: holds the model (loaded by name in the actor) and evaluates batches of decoded images."""

    def __init__(self, config: dict, threads: int = 1) -> None:
        import torch

        torch.set_num_threads(max(1, int(threads)))
        self.evaluator = Evaluator(RunConfig.from_dict(config))

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows: list[dict] = []
        rgb, width, height = (batch.column(c).to_pylist() for c in ("rgb", "width", "height"))
        errors = batch.column("error").to_pylist()
        for k, item in enumerate(_items(batch)):
            if errors[k] is not None:
                rows.append(_error_row(item, errors[k]))
                continue
            try:
                image = Image.frombytes("RGB", (width[k], height[k]), rgb[k])
                rows.extend(self.evaluator.evaluate_image(item, image))
            except Exception as exc:  # one bad image must not stop the run; it is reported
                rows.append(_error_row(item, failure(item, exc).reason))
        return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


def _quiet(record: logging.LogRecord) -> bool:
    """Drop Ray Data's note that progress bars are off: vitviz turned them off to draw its own."""
    return not str(record.getMessage()).startswith("Progress bars disabled")


_INIT_KWARGS = {"logging_level": logging.WARNING, "log_to_driver": False, "include_dashboard": False}


def require_ray() -> None:
    """Raise :class:`EvaluateError` with what to install where Ray Data is missing (an optional dependency)."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError:
        raise EvaluateError("--engine ray needs Ray Data: pip install 'vitviz[ray]' (or 'ray[data]')") from None


def start_local_ray(num_cpus: int | None = None) -> None:
    """Start a local Ray as the engine does: ``num_cpus`` (default: the cores this process may use), workers that
    import vitviz from where this process does, at the normal priority (Ray nices its workers by default; here
    they ARE the job, and on a shared machine a niced worker starves)."""
    import ray

    root = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        num_cpus=num_cpus or available_cores(),
        runtime_env={"env_vars": {"PYTHONPATH": path}},
        _system_config={"worker_niceness": 0},
        **_INIT_KWARGS,
    )


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """A ``host:port`` (or ``ray://host:port``) address nobody answers at is refused at once: Ray itself retries
    such an address for minutes, printing warnings, before it gives up."""
    import socket
    from urllib.parse import urlsplit

    if address == "auto" or address.startswith("local"):
        return
    parts = urlsplit(address if "://" in address else f"ray://{address}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        raise EvaluateError(f"--address {address!r} is not host:port, ray://host:port or auto")
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise EvaluateError(
            f"could not reach the Ray cluster at {address!r} ({exc.strerror or exc}): is a Ray head running there "
            "(`ray start --head`)?"
        ) from None


def _init_ray(address: str | None) -> bool:
    """Connect to (or start) Ray; True when this call started it (and so should shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    if address:
        _check_reachable(address)
    try:
        if address:
            ray.init(address=address, **_INIT_KWARGS)
        else:
            start_local_ray()
    except Exception as exc:  # Ray's own errors are many; the message is what matters
        where = f"the Ray cluster at {address!r}" if address else "a local Ray"
        raise EvaluateError(f"could not start {where}: {str(exc).splitlines()[0] if str(exc) else exc}") from None
    return True


def run_ray(
    config: RunConfig,
    todo: Sequence[Item],
    writer: PartWriter,
    skipped: list[Skipped],
    finish: Callable[[int], None],
    *,
    address: str | None = None,
    actors: int | None = None,
) -> None:
    """Evaluate ``todo`` on Ray (module docstring); rows go to ``writer``, failures to ``skipped``."""
    require_ray()
    import ray
    import ray.data

    started = _init_ray(address)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False  # vitviz draws one bar of its own on the driver
        ctx.print_on_execution_start = False
        logging.getLogger("ray.data._internal.progress").addFilter(_quiet)
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), max(1, int(resources.get("CPU", 1)))
        if gpus:
            size = actors or gpus
            device, actor_resources, threads = "cuda", {"num_gpus": 1, "num_cpus": 1}, 1
        else:
            size = actors or cpus
            device, actor_resources, threads = "cpu", {"num_cpus": 1}, 1
        size = max(1, min(size, len(todo)))
        remote_config = {**config.to_dict(), "device": config.device or device}
        blocks = min(len(todo), max(2 * size, -(-len(todo) // IMAGES_PER_BATCH)))  # every actor gets work
        ds = ray.data.from_items([item.to_dict() for item in todo], override_num_blocks=blocks)
        ds = ds.map_batches(read_images, batch_format="pyarrow", batch_size=IMAGES_PER_BATCH, num_cpus=0)
        ds = ds.map_batches(
            EvaluateActor,
            fn_constructor_kwargs={"config": remote_config, "threads": threads},
            compute=ray.data.ActorPoolStrategy(size=size),
            batch_format="pyarrow",
            batch_size=IMAGES_PER_BATCH,
            **actor_resources,
        )
        methods = len(config.methods)
        pending: dict[str, list[dict]] = {}
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            for row in batch.to_pylist():
                image_id = row["image_id"]
                if row.get("error") is not None:
                    pending.pop(image_id, None)
                    skipped.append(Skipped(row["error_where"], row["error"]))
                    finish(1)
                    continue
                rows = pending.setdefault(image_id, [])
                rows.append({k: row[k] for k in SCHEMA.names})
                if len(rows) == methods:  # the image is complete: all its methods
                    writer.add(pending.pop(image_id))
                    finish(1)
    except (VitvizError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a failed Ray job: say so; the parts written so far are kept
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EvaluateError(
            f"the Ray job failed ({type(exc).__name__}: {first}); rows already written are kept, rerun to continue"
        ) from None
    finally:
        if started:
            ray.shutdown()
