"""Train a TopK (or ReLU + L1) SAE on one named point's activations: ``vitviz sae train``.

Four stages, each resumable (an interrupted run started again with the same settings goes on where it stopped:
nothing already computed is computed again, nothing finished is lost):

1. **Collect** (:func:`collect`). The data set is read with ``evaluate``'s reader (a folder or a CSV; files it
   cannot use are reported and skipped). A seeded split holds ``held_out`` images out for the measures. Images go
   through the model in batches with the point recorded by vitviz's hook registry
   (``vitviz.models.hooks.active(loaded, record=[point])`` around ``vitviz.capture.forward.forward_output``), and
   the tokens asked for (``patches``: the point's patch tokens only; ``all``: every token) are written as float32
   shards (``shard_*.npy``, each at most ``shard_mb``, written to a temporary name and renamed) with a manifest
   of the images each holds. The total is checked BEFORE any forward against ``max_disk_mb`` (ViT-B/16's 196
   patches x 768 x 4 bytes are 0.6 MB an image: 10,000 images are 6 GB); memory holds one shard and one batch.
   On Ctrl-C the shard in progress is written first.
2. **Normalise**: the activations are scaled by one constant ``c = sqrt(d_in) / E||x||`` (the mean norm over the
   training tokens), so that the mean squared norm of a token is about ``d_in`` (SAELens'
   ``expected_average_only_in``, Anthropic's April 2024 update). The factor is folded into the saved weights
   (``W_enc * c``, ``W_dec / c``, ``b_dec / c``), so the saved SAE reads the model's raw activations.
3. **Train** (:func:`train_sae`). Batches of ``batch_tokens`` tokens come from a shuffle buffer of at most
   ``buffer_tokens`` tokens: in each pass over the data the shards are taken in a seeded order, a group of them
   fills the buffer, the buffer is permuted (seeded by pass and group) and cut into batches (a group's last
   partial batch is dropped). Which tokens a step sees is a function of the seed and the step alone, so a resumed
   run sees exactly what an uninterrupted one would. Adam; the loss is the squared error summed over the width and
   averaged over tokens (TopK: plus Gao et al.'s auxiliary loss, 1/32 of the squared error of the residual
   reconstructed from the ``d_in / 2`` strongest dead features; ReLU: plus ``l1`` times the L1 norm of the
   features weighted by the decoder rows' norms); decoder rows are kept at unit norm (the gradient along each row
   removed before the step, the rows renormalised after it). A feature is dead when it has not fired on the last
   ``dead_tokens`` training tokens. The learning rate warms up linearly over the first 5 % of the steps and
   decays linearly to zero over the last 20 %. A checkpoint (step, weights, Adam's state, the dead-feature
   counters, torch's RNG state) is written every ``checkpoint_every`` steps, at the end and on Ctrl-C.
4. **Save and measure**: ``cfg.json`` + ``sae_weights.safetensors`` (a SAELens folder), then ``metrics.json``
   (:func:`vitviz.sae.measure.measure` on the held-out images). The work folder (``.vitviz-sae-work`` inside the
   output folder: shards and checkpoint) is removed after a run that finished, unless ``keep_work``.

Seeded and reproducible: the same settings and seed give the same weights bit for bit on one CPU thread
(``OMP_NUM_THREADS=1``; a multi-threaded matrix product may sum in another order).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from vitviz.sae.activations import point_layout, point_values, select_tokens
from vitviz.sae.model import SAEConfig, SAEError, SparseAutoencoder, save_sae

__all__ = [
    "TrainSettings",
    "TrainReport",
    "Manifest",
    "WORK_DIR",
    "parse_width",
    "split_items",
    "collect",
    "ShardStream",
    "train_sae",
    "train",
]

WORK_DIR = ".vitviz-sae-work"
CHECKPOINT = "checkpoint.pt"
MANIFEST = "manifest.json"
AUX_COEFF = 1 / 32  # Gao et al. 2024's auxiliary-loss coefficient
Progress = Callable[[str, int, int, dict], None]  # stage, done, total, numbers of the moment


@dataclass(frozen=True)
class TrainSettings:
    """What ``vitviz sae train`` was asked (see the module docstring for what each does)."""

    model: str
    point: str
    data: str
    width: str | int = "16x"  # features: "16x" (times the point's width) or a number
    k: int = 32
    activation: Literal["topk", "relu"] = "topk"
    l1: float = 5.0  # relu only: the L1 coefficient (on activations scaled to mean squared norm d_in)
    tokens: Literal["patches", "all"] = "patches"
    seed: int = 0
    steps: int | None = None  # None: 10 passes over the training tokens
    batch_tokens: int = 4096
    lr: float = 4e-4
    held_out: int = 100  # images kept for the measures (metrics.json)
    limit: int | None = None  # use only the first N usable images of the data set
    size: int | tuple[int, int] | None = None
    image_batch: int = 32
    max_disk_mb: float = 4096.0  # the shards' total
    shard_mb: float = 64.0
    buffer_tokens: int = 262_144  # the shuffle buffer (memory: buffer_tokens x d_in x 4 bytes)
    dead_tokens: int = 1_000_000
    checkpoint_every: int = 200
    device: str | None = None
    engine: Literal["local", "ray"] = "local"  # where the activations are collected (training runs here)
    address: str | None = None  # ray: a cluster to join (None: a local Ray)
    actors: int | None = None  # ray: the actor pool's size (None: the cluster's GPUs, else its CPUs)

    def __post_init__(self) -> None:
        if self.engine not in ("local", "ray"):
            raise SAEError(f"the engine is 'local' or 'ray', got {self.engine!r}")
        if self.engine != "ray" and (self.address is not None or self.actors is not None):
            raise SAEError("--address and --actors are for --engine ray")
        if self.actors is not None and (
            isinstance(self.actors, bool) or not isinstance(self.actors, int) or self.actors < 1
        ):
            raise SAEError(f"--actors must be at least 1, got {self.actors!r}")
        for name in ("k", "batch_tokens", "image_batch", "buffer_tokens", "dead_tokens", "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SAEError(f"{name} must be a positive integer, got {v!r}")
        if self.steps is not None and (not isinstance(self.steps, int) or self.steps < 1):
            raise SAEError(f"steps must be a positive integer, got {self.steps!r}")
        if self.held_out < 0:
            raise SAEError(f"held_out must be 0 or more, got {self.held_out}")
        if self.activation not in ("topk", "relu"):
            raise SAEError(f"the trainer makes topk or relu SAEs, not {self.activation!r}")
        if self.tokens not in ("patches", "all"):
            raise SAEError(f"tokens are 'patches' or 'all', got {self.tokens!r}")
        for name in ("lr", "l1", "max_disk_mb", "shard_mb"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise SAEError(f"{name} must be a positive number, got {v!r}")
        if self.buffer_tokens < self.batch_tokens:
            raise SAEError(f"buffer_tokens ({self.buffer_tokens}) must hold one batch ({self.batch_tokens})")


def parse_width(width: str | int, d_in: int) -> int:
    """``"16x"`` -> ``16 * d_in``; a number -> itself."""
    text = str(width).strip().lower()
    try:
        n = round(float(text[:-1]) * d_in) if text.endswith("x") else int(text)
    except ValueError:
        raise SAEError(
            f"--width is a multiple of the point's width (16x) or a number of features, got {width!r}"
        ) from None
    if n < 1:
        raise SAEError(f"--width gives {n} features: at least 1")
    return n


def split_items(items: Sequence, held_out: int, seed: int) -> tuple[list, list]:
    """(training items, held-out items): ``held_out`` items drawn by a generator seeded with ``seed``, both lists
    in the data set's order."""
    n = len(items)
    if held_out and n - held_out < 1:
        raise SAEError(f"{n} usable images cannot keep {held_out} held out and train on the rest: lower --held-out")
    chosen = set(np.random.default_rng([seed, 7]).permutation(n)[:held_out].tolist())
    return [it for i, it in enumerate(items) if i not in chosen], [it for i, it in enumerate(items) if i in chosen]


# --- 1. collection -----------------------------------------------------------------------------------------


@dataclass
class Manifest:
    """What the work folder's shards hold: ``settings`` (what must match to resume), ``shards`` (file name ->
    ``{"tokens": n, "images": [ids]}``), ``d_in``, ``tokens_per_image``, ``skipped`` (where, why)."""

    settings: dict
    shards: dict[str, dict] = field(default_factory=dict)
    d_in: int = 0
    tokens_per_image: int = 0
    skipped: list[list[str]] = field(default_factory=list)
    done: bool = False

    def done_ids(self) -> set[str]:
        return {i for s in self.shards.values() for i in s["images"]}

    @property
    def num_tokens(self) -> int:
        return sum(int(s["tokens"]) for s in self.shards.values())

    def save(self, folder: Path) -> None:
        tmp = folder / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(folder / MANIFEST)

    @classmethod
    def read(cls, folder: Path) -> Manifest | None:
        path = folder / MANIFEST
        if not path.is_file():
            return None
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise SAEError(f"{path} cannot be read ({exc}): delete {folder} to collect the activations again") from None


def _load_items(items: Sequence, skipped: list[list[str]]) -> list[tuple[Any, Any]]:
    from vitviz.errors import VitvizError
    from vitviz.evaluate.data import load_item

    out = []
    for it in items:
        try:
            out.append((it, load_item(it)))
        except VitvizError as exc:
            skipped.append([it.source or it.path, str(exc)])
    return out


def collect(
    loaded,
    point: str,
    items: Sequence,
    work: Path,
    *,
    settings: dict,
    tokens: str = "patches",
    size=None,
    image_batch: int = 32,
    max_disk_mb: float = 4096.0,
    shard_mb: float = 64.0,
    progress: Progress | None = None,
    engine: str = "local",
    model_source: str | None = None,
    address: str | None = None,
    actors: int | None = None,
) -> Manifest:
    """Write the activations of ``items`` at ``point`` as shards in ``work`` (module docstring); resumes a
    manifest of the same ``settings``. Returns the manifest (``done`` when every item was handled).

    ``engine`` ``ray``: the forwards run on Ray actors that load the model by ``model_source``
    (:mod:`vitviz.sae.train_ray`); the shards are the local engine's, byte for byte. ``address``: a cluster to
    join, ``actors``: the pool's size."""
    from vitviz.errors import VitvizError
    from vitviz.evaluate.data import load_item

    work.mkdir(parents=True, exist_ok=True)
    man = Manifest.read(work)
    if man is not None and man.settings != settings:
        raise SAEError(
            f"{work} holds activations collected with other settings ({_diff(man.settings, settings)}): give another "
            "--out, or delete that folder to start again"
        )
    if man is None:
        man = Manifest(settings=settings)
    if man.done:
        return man
    if not items:
        raise SAEError("no images to collect activations from")
    first = None
    for it in items:
        try:
            first = load_item(it)
            break
        except VitvizError:  # reported with the others below
            continue
    if first is None:
        raise SAEError("none of the images could be read")
    hw, n_tokens, n_prefix, n_patch, d_in = point_layout(loaded, point, first, size)
    keep = n_patch if tokens == "patches" else n_tokens
    need = len(items) * keep * d_in * 4
    if need > max_disk_mb * 2**20:
        raise SAEError(
            f"{len(items)} images x {keep} tokens x {d_in} x 4 bytes = {need / 2**20:.0f} MB of activations, over "
            f"--max-disk-mb {max_disk_mb:g}: raise it, use fewer images (--limit), or --tokens patches"
        )
    man.d_in, man.tokens_per_image = d_in, keep
    done = man.done_ids()
    todo = [it for it in items if it.image_id not in done]
    per_shard = max(1, int(shard_mb * 2**20) // (keep * d_in * 4))
    pending: list[np.ndarray] = []
    pending_ids: list[str] = []

    def flush() -> None:
        if not pending:
            return
        name = f"shard_{len(man.shards):05d}.npy"
        arr = np.concatenate(pending)
        tmp = work / (name + ".tmp.npy")
        try:
            np.save(tmp, arr)
            tmp.replace(work / name)
            man.shards[name] = {"tokens": int(arr.shape[0]), "images": list(pending_ids)}
            man.save(work)
        except OSError as exc:  # a full disk: the shards already written stay listed, a rerun goes on from them
            man.shards.pop(name, None)
            tmp.unlink(missing_ok=True)
            raise SAEError(
                f"cannot write {work / name} ({exc.strerror or exc}): the {len(man.shards)} shards written before "
                "are kept; free some space and run the same command again to go on"
            ) from None
        pending.clear()
        pending_ids.clear()

    finished = len(items) - len(todo)
    if progress:
        progress("collect", finished, len(items), {})

    def local_batches():
        for start in range(0, len(todo), image_batch):
            batch = _load_items(todo[start : start + image_batch], man.skipped)
            sel = None
            if batch:
                x, _ = point_values(loaded, point, [img for _, img in batch], hw)
                if x.shape[1] != n_tokens:
                    raise SAEError(f"an image gave {x.shape[1]} tokens at {point}, the first {n_tokens}")
                sel = select_tokens(x, tokens, n_prefix, n_patch).cpu().numpy()
            yield [it for it, _ in batch], sel, []

    if engine == "ray":
        from vitviz.sae.train_ray import ray_batches

        config = {
            "model": model_source or loaded.name,
            "point": point,
            "hw": list(hw),
            "n_tokens": n_tokens,
            "n_prefix": n_prefix,
            "n_patch": n_patch,
            "tokens": tokens,
            "d_in": d_in,
            "device": None,
        }
        batches = ray_batches(config, todo, image_batch, address=address, actors=actors)
    else:
        batches = local_batches()
    try:
        for start, (ok, sel, errors) in zip(range(0, len(todo), image_batch), batches, strict=False):
            man.skipped.extend(errors)
            for j, it in enumerate(ok):
                pending.append(sel[j * keep : (j + 1) * keep])
                pending_ids.append(it.image_id)
                if len(pending_ids) >= per_shard:
                    flush()
            finished += len(todo[start : start + image_batch])
            if progress:
                progress("collect", finished, len(items), {})
    finally:  # Ctrl-C or a failure: what was computed is kept
        try:
            flush()
        finally:
            batches.close()
    man.done = True
    man.save(work)
    return man


def _diff(a: dict, b: dict) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))

    def show(v) -> str:
        return f"{len(v)} entries" if isinstance(v, list) and len(v) > 4 else repr(v)

    return ", ".join(f"{k}: {show(a.get(k))} then {show(b.get(k))}" for k in keys[:4])


# --- 2.-3. training ------------------------------------------------------------------------------------------


class ShardStream:
    """Batches ``(batch_tokens, d)`` float32 from a manifest's shards through a shuffle buffer (module docstring):
    the batch of a step depends on the seed and the step only."""

    def __init__(self, work: Path, man: Manifest, *, seed: int, batch_tokens: int, buffer_tokens: int, scale=1.0):
        self.work, self.seed, self.batch, self.scale = work, seed, batch_tokens, float(scale)
        self.names = sorted(man.shards)
        self.sizes = [int(man.shards[n]["tokens"]) for n in self.names]
        if sum(self.sizes) < batch_tokens:
            raise SAEError(
                f"{sum(self.sizes)} training tokens do not fill one batch of {batch_tokens}: use more images or a "
                "smaller batch"
            )
        self.buffer = buffer_tokens

    def _groups(self, epoch: int) -> list[list[int]]:
        order = np.random.default_rng([self.seed, 11, epoch]).permutation(len(self.names)).tolist()
        groups, cur, n = [], [], 0
        for i in order:
            if cur and n + self.sizes[i] > self.buffer:
                groups.append(cur)
                cur, n = [], 0
            cur.append(i)
            n += self.sizes[i]
        if cur:
            groups.append(cur)
        return groups

    def batches_per_epoch(self) -> int:
        return sum(sum(self.sizes[i] for i in g) // self.batch for g in self._groups(0))

    def _load(self, group: list[int], epoch: int, g: int) -> torch.Tensor:
        arr = np.concatenate([np.load(self.work / self.names[i]) for i in group])
        perm = np.random.default_rng([self.seed, 13, epoch, g]).permutation(arr.shape[0])
        return torch.from_numpy(arr[perm]) * self.scale

    def from_step(self, step: int):
        """Yield ``(step, batch)`` from ``step`` on, forever (passes repeat with new orders)."""
        epoch, s = 0, 0
        while True:
            for g, group in enumerate(self._groups(epoch)):
                n = sum(self.sizes[i] for i in group) // self.batch
                if s + n <= step:  # this group's batches are all before the start: not loaded
                    s += n
                    continue
                buf = self._load(group, epoch, g)
                for b in range(n):
                    if s >= step:
                        yield s, buf[b * self.batch : (b + 1) * self.batch]
                    s += 1
            epoch += 1

    def mean_norm(self, max_tokens: int = 1_000_000) -> float:
        """E||x|| over the (first ``max_tokens``, in shard order) training tokens."""
        total, n = 0.0, 0
        for name in self.names:
            arr = np.load(self.work / name, mmap_mode="r")
            take = arr[: max(0, max_tokens - n)]
            total += float(np.linalg.norm(np.asarray(take, np.float64), axis=1).sum())
            n += take.shape[0]
            if n >= max_tokens:
                break
        return total / max(n, 1)


def lr_factor(step: int, steps: int) -> float:
    """Linear warm-up over the first 5 % of the steps, constant, linear decay to 0 over the last 20 %."""
    warm = max(1, steps // 20)
    decay = max(1, steps // 5)
    return min(1.0, (step + 1) / warm, (steps - step) / decay)


def _init_sae(cfg: SAEConfig, sample: torch.Tensor, seed: int) -> SparseAutoencoder:
    """Decoder rows random unit vectors, the encoder their transpose, ``b_dec`` the sample's mean, ``b_enc`` 0."""
    torch.manual_seed(seed)
    sae = SparseAutoencoder(cfg)
    with torch.no_grad():
        sae.W_dec.copy_(torch.randn(cfg.d_sae, cfg.d_in))
        sae.normalise_decoder()
        sae.W_enc.copy_(sae.W_dec.T)
        sae.b_dec.copy_(sample.mean(dim=0))
    return sae


def _gathered(sae: SparseAutoencoder, sae_in: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Pre-activations of the features ``idx`` ``(B, m)`` only, ``(B, m)``, in the autograd graph: the encoder's
    gradient then touches those columns alone (a sparse backward instead of a dense ``(B, d_sae)`` one)."""
    w = torch.nn.functional.embedding(idx, sae.W_enc.T)  # (B, m, d_in)
    return (w @ sae_in[:, :, None])[..., 0] + sae.b_enc[idx]


def _sparse_decode(sae: SparseAutoencoder, vals: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``sum_j vals[:, j] * W_dec[idx[:, j]]`` ``(B, d_in)``: the decoder on ``m`` features per token."""
    return (vals[:, None, :] @ torch.nn.functional.embedding(idx, sae.W_dec))[:, 0]


def _step_loss(sae: SparseAutoencoder, x: torch.Tensor, since: torch.Tensor, dead_tokens: int, l1: float):
    """(loss, numbers) of one batch (``x`` already scaled); ``since`` counts tokens since each feature fired.

    TopK: the dense pre-activations pick the k features (no gradient), whose pre-activations are then recomputed
    in the graph; the same numbers as :meth:`SparseAutoencoder.activate` up to the order of a sum's terms."""
    dead = since >= dead_tokens
    aux = torch.zeros(())
    if sae.cfg.activation == "topk":
        sae_in = x - sae.b_dec if sae.cfg.apply_b_dec_to_input else x
        with torch.no_grad():
            pre = sae_in @ sae.W_enc + sae.b_enc
            idx = torch.topk(pre, sae.cfg.k, dim=-1, sorted=False).indices
        vals = _gathered(sae, sae_in, idx)
        vals = vals.relu() if sae.cfg.topk_relu else vals
        x_hat = _sparse_decode(sae, vals, idx) + sae.b_dec
        on = vals > 0
        fired_ids, l0 = idx[on], on.sum(dim=-1)
    else:
        f = sae.activate(sae.pre_activations(x))
        x_hat = f @ sae.W_dec + sae.b_dec
        fired_ids, l0 = torch.nonzero((f > 0).any(dim=0))[:, 0], (f > 0).sum(dim=-1)
    err = x - x_hat
    mse = err.pow(2).sum(dim=-1).mean()
    loss = mse
    if sae.cfg.activation == "topk" and bool(dead.any()):
        # Gao et al.'s auxiliary loss: the residual reconstructed by the strongest dead features
        dead_ids = torch.nonzero(dead)[:, 0]
        k_aux = min(max(1, sae.d_in // 2), len(dead_ids))
        with torch.no_grad():
            sub = torch.topk(pre[:, dead_ids], k_aux, dim=-1, sorted=False).indices
        aux_idx = dead_ids[sub]
        e_hat = _sparse_decode(sae, _gathered(sae, sae_in, aux_idx).relu(), aux_idx)
        aux = (err.detach() - e_hat).pow(2).sum(dim=-1).mean()
        loss = loss + AUX_COEFF * aux
    if sae.cfg.activation == "relu":
        loss = loss + l1 * (f * sae.W_dec.norm(dim=1)).sum(dim=-1).mean()
    with torch.no_grad():
        since += x.shape[0]
        since[fired_ids] = 0
        var = (x - x.mean(dim=0)).pow(2).sum(dim=-1).mean()
        numbers = {
            "mse": float(mse),
            "fvu": float(mse / var) if float(var) > 0 else float("nan"),
            "l0": float(l0.float().mean()),
            "dead": int(dead.sum()),
            "aux": float(aux),
        }
    return loss, numbers


def _save_checkpoint(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    try:
        torch.save(state, tmp)
        tmp.replace(path)
    except OSError as exc:  # the previous checkpoint (if any) stays as it was
        tmp.unlink(missing_ok=True)
        raise SAEError(
            f"cannot write the checkpoint {path} ({exc.strerror or exc}): free some space and run the same command "
            "again to go on from the last checkpoint"
        ) from None


def train_sae(
    work: Path,
    man: Manifest,
    cfg: SAEConfig,
    *,
    seed: int,
    steps: int | None,
    batch_tokens: int,
    buffer_tokens: int,
    lr: float,
    l1: float = 5.0,
    dead_tokens: int = 1_000_000,
    checkpoint_every: int = 200,
    progress: Progress | None = None,
    stop_after: int | None = None,
) -> tuple[SparseAutoencoder, dict]:
    """Train (or resume) the SAE of ``cfg`` on the manifest's shards; returns the SAE with the normalisation folded
    in (it reads raw activations) and the training record. ``stop_after``: stop at that step as an interruption
    would (tests)."""
    probe = ShardStream(work, man, seed=seed, batch_tokens=batch_tokens, buffer_tokens=buffer_tokens)
    ckpt_path = work / CHECKPOINT
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True) if ckpt_path.is_file() else None
    if ckpt is not None:
        scale = float(ckpt["scale"])
        total = int(ckpt["steps"])
    else:
        scale = math.sqrt(cfg.d_in) / max(probe.mean_norm(), 1e-12)
        total = steps or 10 * max(1, probe.batches_per_epoch())
    if steps is not None and steps != total:
        raise SAEError(f"the checkpoint in {work} trains for {total} steps, not {steps}: give the same --steps")
    stream = ShardStream(work, man, seed=seed, batch_tokens=batch_tokens, buffer_tokens=buffer_tokens, scale=scale)
    sample = next(stream.from_step(0))[1]
    sae = _init_sae(cfg, sample, seed)
    opt = torch.optim.Adam(sae.parameters(), lr=lr)
    since = torch.zeros(cfg.d_sae, dtype=torch.long)
    start, history = 0, []
    if ckpt is not None:
        sae.load_state_dict(ckpt["sae"])
        opt.load_state_dict(ckpt["optimizer"])
        since = ckpt["since"].clone()
        start = int(ckpt["step"])
        history = [
            dict(zip(("step", "mse", "fvu", "l0", "dead"), row, strict=True)) for row in ckpt["history"].tolist()
        ]
        torch.set_rng_state(ckpt["rng"])

    def checkpoint(step: int) -> None:
        rows = [[h["step"], h["mse"], h["fvu"], h["l0"], h["dead"]] for h in history]
        _save_checkpoint(
            ckpt_path,
            {
                "step": step,
                "steps": total,
                "scale": scale,
                "sae": sae.state_dict(),
                "optimizer": opt.state_dict(),
                "since": since,
                "history": torch.tensor(rows, dtype=torch.float64).reshape(-1, 5),
                "rng": torch.get_rng_state(),
            },
        )

    step = start
    t0 = time.time()
    try:
        batches = stream.from_step(start)
        while step < total:
            if stop_after is not None and step >= stop_after:
                raise KeyboardInterrupt
            _, x = next(batches)
            for group in opt.param_groups:
                group["lr"] = lr * lr_factor(step, total)
            loss, numbers = _step_loss(sae, x, since, dead_tokens, l1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            sae.remove_parallel_gradient()
            opt.step()
            sae.normalise_decoder()
            step += 1
            if step % 50 == 0 or step == total:
                history.append({"step": step, **{k: numbers[k] for k in ("mse", "fvu", "l0", "dead")}})
            if progress:
                progress("train", step, total, numbers)
            if step % checkpoint_every == 0 and step < total:
                checkpoint(step)
    finally:
        if step < total:  # interrupted: keep what was done
            checkpoint(step)
    checkpoint(step)
    folded = _fold(sae, scale)
    record = {
        "steps": total,
        "seed": seed,
        "batch_tokens": batch_tokens,
        "buffer_tokens": buffer_tokens,
        "lr": lr,
        "scale": scale,
        "normalisation": "each token scaled by sqrt(d_in) / E||x|| while training; the factor is in the weights",
        "training_tokens": man.num_tokens,
        "dead_features": int((since >= dead_tokens).sum()),
        "dead_after_tokens": dead_tokens,
        "seconds_this_session": round(time.time() - t0, 1),
        "history": history[-20:],
    }
    return folded, record


def _fold(sae: SparseAutoencoder, scale: float) -> SparseAutoencoder:
    """The SAE on raw activations of one trained on ``scale * x`` (SAELens' fold_activation_norm_scaling_factor)."""
    out = SparseAutoencoder(sae.cfg)
    with torch.no_grad():
        out.W_enc.copy_(sae.W_enc * scale)
        out.b_enc.copy_(sae.b_enc)
        out.W_dec.copy_(sae.W_dec / scale)
        out.b_dec.copy_(sae.b_dec / scale)
    return out.eval().requires_grad_(False)


# --- 4. the whole run ---------------------------------------------------------------------------------------


@dataclass
class TrainReport:
    out: Path
    sae: SparseAutoencoder
    training: dict
    metrics: dict | None
    skipped: list[list[str]]


def train(
    settings: TrainSettings,
    out: str | Path,
    *,
    loaded=None,
    progress: Progress | None = None,
    keep_work: bool = False,
    measure: bool = True,
    stop_after: int | None = None,
) -> TrainReport:
    """Collect, train, save and measure (module docstring); ``loaded``: the model already loaded (else
    ``settings.model`` is loaded). Resumes an interrupted run of the same settings in ``out``."""
    from vitviz.evaluate.data import read_dataset
    from vitviz.models.load import load_model

    out = Path(out)
    if (out / "cfg.json").exists() and not (out / WORK_DIR).exists():
        raise SAEError(f"{out} already holds a trained SAE: give another --out")
    if loaded is None:
        loaded = load_model(settings.model, device=settings.device)
    dataset = read_dataset(settings.data, limit=settings.limit)
    # what stopped the listing (a folder past evaluate's MAX_FILES entries, a CSV past its rows) is reported too
    listing = [[e.where, e.reason] for e in dataset.skipped.noted]
    train_items, held = split_items(dataset.items, settings.held_out, settings.seed)
    work = out / WORK_DIR
    keyed = {
        k: v
        for k, v in asdict(settings).items()
        if k in ("model", "point", "data", "tokens", "size", "limit", "held_out", "seed")
    }
    keyed["size"] = list(keyed["size"]) if isinstance(keyed["size"], tuple) else keyed["size"]
    keyed["images"] = [it.image_id for it in train_items]
    man = collect(
        loaded,
        settings.point,
        train_items,
        work,
        settings=keyed,
        tokens=settings.tokens,
        size=settings.size,
        image_batch=settings.image_batch,
        max_disk_mb=settings.max_disk_mb,
        shard_mb=settings.shard_mb,
        progress=progress,
        engine=settings.engine,
        model_source=settings.model,
        address=settings.address,
        actors=settings.actors,
    )
    d_sae = parse_width(settings.width, man.d_in)
    cfg = SAEConfig(
        d_in=man.d_in,
        d_sae=d_sae,
        activation=settings.activation,
        k=settings.k if settings.activation == "topk" else None,
        point=settings.point,
        model=settings.model,
        tokens=settings.tokens,
    )
    if settings.activation == "topk" and settings.k > d_sae:
        raise SAEError(f"--k {settings.k} is more than the {d_sae} features")
    sae, record = train_sae(
        work,
        man,
        cfg,
        seed=settings.seed,
        steps=settings.steps,
        batch_tokens=settings.batch_tokens,
        buffer_tokens=settings.buffer_tokens,
        lr=settings.lr,
        l1=settings.l1,
        dead_tokens=settings.dead_tokens,
        checkpoint_every=settings.checkpoint_every,
        progress=progress,
        stop_after=stop_after,
    )
    record["images"] = len(train_items)
    record["held_out_images"] = len(held)
    record["data"] = str(settings.data)
    record.pop("seconds_this_session", None)  # the folder is rebuilt bit for bit: no timings in it
    sae.cfg = sae.cfg.with_(training=record)
    save_sae(sae, out)
    metrics = None
    if measure and held:
        from vitviz.sae.measure import measure as measure_sae
        from vitviz.sae.measure import write_metrics

        metrics = measure_sae(sae, loaded, held, size=settings.size, progress=progress).as_dict()
        write_metrics(out, metrics)
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return TrainReport(out, sae, record, metrics, [*listing, *man.skipped])


def threads_note() -> str:
    """How many threads torch uses (bit-for-bit reproducibility holds for one)."""
    return f"{torch.get_num_threads()} torch thread(s) (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})"
