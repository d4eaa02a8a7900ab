"""The feature index on Ray (``vitviz sae index --engine ray``), built as ``evaluate``'s Ray engine is.

Ray Data reads the items, decodes each image in a light stage (``evaluate``'s :func:`read_images`: errors travel
with the image), and a pool of actors, each holding the model (loaded by the name given to ``--model``) and the SAE
(loaded from its folder or file, and checked against the driver's by its weights' digest), turns a few images at a
time into a partial :class:`~vitviz.sae.index.IndexState` (counts, sums, histogram counts and the ``top_k`` best
of those images, one row of bytes). The driver merges the partial states as they arrive; the merge is independent
of their order (activation descending, then the token's place in the data set), so the file is the local engine's.

``address`` None starts a local Ray (or uses the one already running); otherwise ``ray.init(address=...)`` joins
that cluster, whose nodes must see the images, the SAE and the model at the same paths.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import pyarrow as pa
from PIL import Image

from vitviz.errors import VitvizError
from vitviz.evaluate.data import Item, SkipLog, Skipped
from vitviz.sae.index_state import FeatureIndexError, IndexState, encode_batch, sae_digest

__all__ = ["run_ray", "IndexActor", "IMAGES_PER_BATCH"]

IMAGES_PER_BATCH = 4


def _row(state: IndexState | None, ok: list[int], errors: list[tuple[str, str]]) -> dict:
    base = state.to_row() if state is not None else {"tokens": 0, **dict.fromkeys(_BYTES, b"")}
    return {**base, "ok": ok, "err_where": [w for w, _ in errors], "err_reason": [r for _, r in errors]}


_BYTES = ("active", "total", "hist", "top_val", "top_pos")
ROW_SCHEMA = pa.schema(
    [
        ("tokens", pa.int64()),
        *[(name, pa.large_binary()) for name in _BYTES],
        ("ok", pa.list_(pa.int64())),
        ("err_where", pa.list_(pa.string())),
        ("err_reason", pa.list_(pa.string())),
    ]
)


class IndexActor:
    """Holds the model and the SAE; turns a batch of decoded images into one row: a partial state."""

    def __init__(self, config: dict, threads: int = 1) -> None:
        import torch

        from vitviz.models.load import load_model
        from vitviz.sae.load import load_sae

        torch.set_num_threads(max(1, int(threads)))
        self.config = config
        self.loaded = load_model(config["model"], device=config.get("device"))
        self.sae = load_sae(config["sae"], point=config["point"], loaded=self.loaded).to(self.loaded.device)
        if sae_digest(self.sae) != config["digest"]:
            raise FeatureIndexError(f"the SAE at {config['sae']} is not the driver's (its weights differ)")

    def __call__(self, batch: pa.Table) -> pa.Table:
        from vitviz.evaluate.ray_engine import _items
        from vitviz.evaluate.worker import failure

        cfg = self.config
        items = _items(batch)
        places = batch.column("place").to_pylist()
        rgb, width, height, errs = (batch.column(c).to_pylist() for c in ("rgb", "width", "height", "error"))
        pics, ok, errors = [], [], []
        for k, item in enumerate(items):
            if errs[k] is not None:
                errors.append((failure(item, VitvizError(errs[k])).where, errs[k]))
                continue
            pics.append(Image.frombytes("RGB", (width[k], height[k]), rgb[k]))
            ok.append((places[k], item))
        state = None
        if pics:
            try:
                f, positions = encode_batch(
                    self.sae, self.loaded, cfg["point"], pics, [p for p, _ in ok], cfg["layout"]
                )
                state = IndexState(cfg["d_sae"], cfg["top_k"])
                state.add(f, positions)
            except FeatureIndexError:
                raise
            except Exception as exc:  # the batch's images are reported, the run goes on
                for _, item in ok:
                    s = failure(item, exc)
                    errors.append((s.where, s.reason))
                ok = []
        return pa.Table.from_pylist([_row(state, [p for p, _ in ok], errors)], schema=ROW_SCHEMA)


def run_ray(
    config: dict,
    items: Sequence[Item],
    state: IndexState,
    images: dict[int, tuple[str, str]],
    skipped: SkipLog,
    finish: Callable[[int], None],
    *,
    address: str | None = None,
    actors: int | None = None,
) -> None:
    """Index ``items`` on Ray (module docstring): partial states merged into ``state``, indexed images into
    ``images`` (place -> (id, path)), failures into ``skipped``; ``finish(n)`` after each batch."""
    from vitviz.evaluate.ray_engine import require_ray

    require_ray()
    import ray
    import ray.data

    from vitviz.evaluate.ray_engine import _init_ray, _quiet, read_images

    if not items:
        return
    started = _init_ray(address)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        logging.getLogger("ray.data._internal.progress").addFilter(_quiet)
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), max(1, int(resources.get("CPU", 1)))
        size = actors or (gpus or cpus)
        device, actor_resources = ("cuda", {"num_gpus": 1, "num_cpus": 1}) if gpus else ("cpu", {"num_cpus": 1})
        size = max(1, min(size, len(items)))
        remote = {**config, "device": config.get("device") or device}
        rows = [{**item.to_dict(), "place": place} for place, item in enumerate(items)]
        blocks = min(len(rows), max(2 * size, -(-len(rows) // IMAGES_PER_BATCH)))
        ds = ray.data.from_items(rows, override_num_blocks=blocks)
        ds = ds.map_batches(read_images, batch_format="pyarrow", batch_size=IMAGES_PER_BATCH, num_cpus=0)
        ds = ds.map_batches(
            IndexActor,
            fn_constructor_kwargs={"config": remote, "threads": 1},
            compute=ray.data.ActorPoolStrategy(size=size),
            batch_format="pyarrow",
            batch_size=IMAGES_PER_BATCH,
            **actor_resources,
        )
        d_sae, top_k = int(config["d_sae"]), int(config["top_k"])
        for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow"):
            for row in batch.to_pylist():
                for where, reason in zip(row["err_where"], row["err_reason"], strict=True):
                    skipped.append(Skipped(where, reason))
                if row["ok"]:
                    state.merge(IndexState.from_row(row, d_sae, top_k))
                    images.update((p, (items[p].image_id, items[p].path)) for p in row["ok"])
                finish(len(row["ok"]) + len(row["err_where"]))
    except (VitvizError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a failed Ray job: say so
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise FeatureIndexError(f"the Ray job failed ({type(exc).__name__}: {first}); nothing was written") from None
    finally:
        if started:
            ray.shutdown()
