"""The activation collection of ``vitviz sae train --engine ray``, built as ``sae index``'s and ``evaluate``'s Ray
engines are.

The images still to collect are cut into the local engine's batches (``image_batch`` images each, in the data set's
order); each batch is one Ray Data row. A pool of actors, each holding the model (loaded once, by the name given to
``--model``, one torch thread), reads a row's images (``evaluate``'s reader: a file it cannot use is reported, as
the local engine reports it), runs the batch's readable images in one forward with the point recorded and returns
the tokens asked for (``patches`` or ``all``) as float32 bytes. The driver takes the batches back in the data set's
order, whatever order they arrive in (a batch that arrives early waits for those before it), and writes them
through the local engine's shard writer: the same batches through the same arithmetic give the same shards, byte
for byte (on one thread, as the local engine's reproducibility asks). Training then reads the shards as always.

``address`` None starts a local Ray (or uses the one already running); otherwise ``ray.init(address=...)`` joins
that cluster, whose nodes must see the images and the model at the same paths.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from vitviz.errors import VitvizError
from vitviz.sae.model import SAEError

__all__ = ["ray_batches", "CollectActor"]

ROW_SCHEMA = pa.schema(
    [
        ("batch", pa.int64()),
        ("ok", pa.list_(pa.int64())),
        ("values", pa.large_binary()),
        ("err_where", pa.list_(pa.string())),
        ("err_reason", pa.list_(pa.string())),
    ]
)


class CollectActor:
    """Holds the model; turns one batch of items (a row) into the point's selected tokens of its readable images."""

    def __init__(self, config: dict, threads: int = 1) -> None:
        import torch

        from vitviz.models.load import load_model

        torch.set_num_threads(max(1, int(threads)))
        self.config = config
        self.loaded = load_model(config["model"], device=config.get("device"))

    def __call__(self, batch: pa.Table) -> pa.Table:
        from vitviz.evaluate.data import Item, load_item
        from vitviz.sae.activations import point_values, select_tokens

        cfg = self.config
        rows = []
        for number, text in zip(batch.column("batch").to_pylist(), batch.column("items").to_pylist(), strict=True):
            items = [Item.from_dict(d) for d in json.loads(text)]
            ok, images, where, reason = [], [], [], []
            for j, it in enumerate(items):
                try:
                    images.append(load_item(it))
                    ok.append(j)
                except VitvizError as exc:  # reported as the local engine reports it
                    where.append(it.source or it.path)
                    reason.append(str(exc))
            values = b""
            if images:
                x, _ = point_values(self.loaded, cfg["point"], images, tuple(cfg["hw"]))
                if x.shape[1] != cfg["n_tokens"]:
                    raise SAEError(f"an image gave {x.shape[1]} tokens at {cfg['point']}, the first {cfg['n_tokens']}")
                sel = select_tokens(x, cfg["tokens"], cfg["n_prefix"], cfg["n_patch"]).cpu().numpy()
                values = np.ascontiguousarray(sel, dtype=np.float32).tobytes()
            rows.append({"batch": number, "ok": ok, "values": values, "err_where": where, "err_reason": reason})
        return pa.Table.from_pylist(rows, schema=ROW_SCHEMA)


def ray_batches(
    config: dict,
    todo: Sequence,
    image_batch: int,
    *,
    address: str | None = None,
    actors: int | None = None,
) -> Iterator[tuple[list, np.ndarray | None, list[list[str]]]]:
    """Yield, for each batch of ``image_batch`` items of ``todo`` in order, ``(the batch's readable items, their
    selected tokens (n_items x keep, d_in) float32 or None, [where, why] of the unreadable)``, computed on Ray.

    ``config``: ``model``, ``point``, ``hw``, ``n_tokens``, ``n_prefix``, ``n_patch``, ``tokens``, ``d_in``,
    ``device`` (None: cuda where the cluster has GPUs)."""
    try:
        import ray
        import ray.data
    except ImportError:
        raise SAEError("--engine ray needs Ray Data: pip install 'vitviz[ray]' (or 'ray[data]')") from None

    from vitviz.evaluate.ray_engine import _init_ray, _quiet

    chunks = [list(todo[s : s + image_batch]) for s in range(0, len(todo), image_batch)]
    if not chunks:
        return
    started = _init_ray(address)
    ctx = ray.data.DataContext.get_current()
    before = (ctx.enable_progress_bars, ctx.print_on_execution_start, ctx.execution_options.preserve_order)
    try:
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        ctx.execution_options.preserve_order = True  # keeps the driver's waiting room small; the order is re-made
        logging.getLogger("ray.data._internal.progress").addFilter(_quiet)
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), max(1, int(resources.get("CPU", 1)))
        size = max(1, min(actors or (gpus or cpus), len(chunks)))
        device, actor_resources = ("cuda", {"num_gpus": 1, "num_cpus": 1}) if gpus else ("cpu", {"num_cpus": 1})
        remote = {**config, "device": config.get("device") or device}
        rows = [{"batch": b, "items": json.dumps([it.to_dict() for it in c])} for b, c in enumerate(chunks)]
        ds = ray.data.from_items(rows, override_num_blocks=len(rows))
        ds = ds.map_batches(
            CollectActor,
            fn_constructor_kwargs={"config": remote, "threads": 1},
            compute=ray.data.ActorPoolStrategy(size=size),
            batch_format="pyarrow",
            batch_size=1,
            **actor_resources,
        )
        waiting: dict[int, dict] = {}
        nxt = 0
        for table in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            for row in table.to_pylist():
                waiting[int(row["batch"])] = row
            while nxt in waiting:
                row = waiting.pop(nxt)
                chunk = chunks[nxt]
                ok = [chunk[j] for j in row["ok"]]
                values = None
                if ok:
                    values = np.frombuffer(row["values"], dtype=np.float32).reshape(-1, int(config["d_in"]))
                errors = [[w, r] for w, r in zip(row["err_where"], row["err_reason"], strict=True)]
                yield ok, values, errors
                nxt += 1
        if nxt != len(chunks):
            raise SAEError(f"the Ray job returned {nxt} of {len(chunks)} batches; rerun to continue")
    except (VitvizError, KeyboardInterrupt, GeneratorExit):
        raise
    except Exception as exc:  # a failed Ray job: say so; the shards already written are kept
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SAEError(
            f"the Ray job failed ({type(exc).__name__}: {first}); the shards already written are kept, run the same "
            "command again to continue"
        ) from None
    finally:
        ctx.enable_progress_bars, ctx.print_on_execution_start, ctx.execution_options.preserve_order = before
        if started:
            ray.shutdown()
