"""``vitviz sae {train,measure,index,train-demo,index-demo}``: the command line of :mod:`vitviz.sae` (registered by ``__main__``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["add_parser"]


def _bar():
    """A progress callback drawing one tqdm bar per stage (collect, train, measure) on stderr."""
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def progress(stage: str, done: int, total: int, numbers: dict) -> None:
        bar = bars.get(stage)
        if bar is None:
            for other in bars.values():
                other.close()
            bar = bars[stage] = tqdm(total=total, initial=done, desc=stage, file=sys.stderr, unit="step")
        bar.update(done - bar.n)
        if numbers:
            bar.set_postfix({k: f"{v:.3g}" if isinstance(v, float) else v for k, v in numbers.items()}, refresh=False)
        if done >= total:
            bar.close()

    return progress


def _check_ray_options(args: argparse.Namespace) -> None:
    """``--address`` and ``--actors`` (train and index): only with ``--engine ray``, at least one actor."""
    from vitviz.cli_checks import UsageError

    if args.engine != "ray" and (args.address is not None or args.actors is not None):
        raise UsageError("--address and --actors are for --engine ray")
    if args.actors is not None and args.actors < 1:
        raise UsageError(f"--actors must be at least 1, got {args.actors}")


def _train(args: argparse.Namespace) -> int:
    from vitviz.cli_checks import input_size
    from vitviz.sae.train import TrainSettings, train

    _check_ray_options(args)
    settings = TrainSettings(
        model=args.model,
        point=args.point,
        data=args.data,
        width=args.width,
        k=args.k,
        activation=args.activation,
        l1=args.l1,
        tokens=args.tokens,
        seed=args.seed,
        steps=args.steps,
        batch_tokens=args.batch_tokens,
        lr=args.lr,
        held_out=args.held_out,
        limit=args.limit,
        size=input_size(args.size),
        max_disk_mb=args.max_disk_mb,
        device=args.device,
        engine=args.engine,
        address=args.address,
        actors=args.actors,
    )
    report = train(settings, args.out, progress=_bar(), keep_work=args.keep_activations)
    for where, why in report.skipped:
        print(f"skipped: {where}: {why}", file=sys.stderr)
    print(f"wrote {report.out} ({report.sae.cfg.describe()})")
    if report.metrics:
        print(json.dumps(report.metrics, indent=2))
    return 0


def _measure(args: argparse.Namespace) -> int:
    from vitviz.cli_checks import input_size
    from vitviz.evaluate.data import read_dataset
    from vitviz.models.load import load_model
    from vitviz.sae.load import load_sae
    from vitviz.sae.measure import measure, write_metrics

    loaded = load_model(args.model, device=args.device)
    sae = load_sae(args.sae, point=args.point, loaded=loaded)
    items = read_dataset(args.data, limit=args.limit).items
    metrics = measure(sae, loaded, items, size=input_size(args.size), progress=_bar()).as_dict()
    if args.write:
        if not Path(args.sae).is_dir():
            print(f"--write: {args.sae} is not a folder", file=sys.stderr)
            return 2
        print(f"wrote {write_metrics(args.sae, metrics)}")
    print(json.dumps(metrics, indent=2))
    return 0


def _index(args: argparse.Namespace) -> int:
    from vitviz.cli_checks import input_size, terminal_text
    from vitviz.models.load import load_model
    from vitviz.sae.index import build_index
    from vitviz.sae.load import load_sae

    _check_ray_options(args)
    loaded = load_model(args.model, device=args.device)
    sae = load_sae(args.sae, point=args.point, loaded=loaded).to(loaded.device)  # encode where the model runs
    report = build_index(
        sae,
        loaded,
        args.data,
        args.out,
        model_source=args.model,
        top_k=args.top_k,
        size=input_size(args.size),
        batch=args.batch,
        limit=args.limit,
        max_rows=args.max_rows,
        engine=args.engine,
        sae_path=args.sae,
        address=args.address,
        actors=args.actors,
        overwrite=args.overwrite,
        progress=_bar(),
    )
    if report.resumed:
        print(f"resumed: an interrupted run had done the first {report.resumed} items of the listing", file=sys.stderr)
    for where, why in report.skipped[:20]:
        print(f"skipped: {terminal_text(where)}: {terminal_text(why)}", file=sys.stderr)
    if report.skipped_total > 20:
        print(f"... and {report.skipped_total - 20} more skipped (listed in the index's metadata)", file=sys.stderr)
    print(
        f"wrote {terminal_text(report.out)}: {report.features} features over {report.images} images "
        f"({report.tokens} tokens), {report.skipped_total} skipped, {report.seconds:.0f} s"
    )
    return 0


def _train_demo(args: argparse.Namespace) -> int:
    from vitviz.sae.demo import blocks_table, compare_blocks, train_demo_sae

    if args.compare_blocks:
        print(blocks_table(compare_blocks(progress=_bar())))
        return 0
    result = train_demo_sae(args.out, progress=_bar())
    print(f"wrote {result.out}")
    print(result.table())
    return 0


def _index_demo(args: argparse.Namespace) -> int:
    from vitviz.sae.demo import index_demo_sae

    print(f"wrote {index_demo_sae(args.out, progress=_bar())}")
    return 0


def add_parser(sub) -> None:
    """Register ``sae`` and its commands on the main parser's subparsers."""
    sae = sub.add_parser("sae", help="sparse-autoencoder features: train, measure, rebuild the demo's SAE")
    cmds = sae.add_subparsers(dest="sae_command", required=True)

    tr = cmds.add_parser(
        "train",
        help="train an SAE on one point's activations over a folder of images",
        description="Collect one point's activations over the images (shards on disk, bounded), train a TopK SAE "
        "(or ReLU + L1), save it as a SAELens folder (cfg.json + sae_weights.safetensors) and measure it on "
        "held-out images (metrics.json). An interrupted run started again with the same options resumes.",
    )
    tr.add_argument("--model", default="demo", help="'demo', a hub id or a local folder")
    tr.add_argument("--point", required=True, help="the vitviz point, e.g. blocks.2.out")
    tr.add_argument("--data", required=True, metavar="FOLDER_OR_CSV", help="images, as `evaluate` reads them")
    tr.add_argument("--out", required=True, help="the SAE's folder (also the work folder while training)")
    tr.add_argument("--width", default="16x", help="features: a multiple of the point's width (16x) or a number")
    tr.add_argument("--k", type=int, default=32, help="TopK: features kept per token (default 32)")
    tr.add_argument("--activation", default="topk", choices=("topk", "relu"), help="topk, or relu with an L1 loss")
    tr.add_argument("--l1", type=float, default=5.0, help="relu: the L1 coefficient (default 5)")
    tr.add_argument(
        "--tokens",
        default="patches",
        choices=("patches", "all"),
        help="train on the patch tokens only (default) or on every token (CLS, registers...)",
    )
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--steps", type=int, default=None, help="default: 10 passes over the training tokens")
    tr.add_argument("--batch-tokens", type=int, default=4096, help="tokens per step (default 4096)")
    tr.add_argument("--lr", type=float, default=4e-4, help="Adam's peak learning rate (default 4e-4)")
    tr.add_argument("--held-out", type=int, default=100, help="images kept out of training for metrics.json")
    tr.add_argument("--limit", type=int, default=None, help="use the first N usable images only")
    tr.add_argument("--size", type=int, nargs="+", metavar="PX", help="input size: one number (square) or H W")
    tr.add_argument(
        "--max-disk-mb", type=float, default=4096.0, help="refuse before starting if the activations need more"
    )
    tr.add_argument("--keep-activations", action="store_true", help="keep the shards after training")
    tr.add_argument(
        "--engine",
        default="local",
        choices=("local", "ray"),
        help="where the activations are collected: local (default) or ray (the same shards; training runs here)",
    )
    tr.add_argument("--address", default=None, help="ray: a cluster to join (default: a local Ray)")
    tr.add_argument("--actors", type=int, default=None, help="ray: the actor pool's size (default: GPUs, else CPUs)")
    tr.add_argument("--device", default=None)
    tr.set_defaults(func=_train)

    me = cmds.add_parser("measure", help="explained variance, L0, dead/dense features and the splice cost")
    me.add_argument("--sae", required=True, help="an SAE folder or file (SAELens, ViT-Prisma, saev)")
    me.add_argument("--model", default="demo")
    me.add_argument("--data", required=True, metavar="FOLDER_OR_CSV", help="held-out images")
    me.add_argument("--point", default=None, help="the point, where the checkpoint does not say (saev)")
    me.add_argument("--limit", type=int, default=None)
    me.add_argument("--size", type=int, nargs="+", metavar="PX")
    me.add_argument("--write", action="store_true", help="also write metrics.json into the SAE's folder")
    me.add_argument("--device", default=None)
    me.set_defaults(func=_measure)

    ix = cmds.add_parser(
        "index",
        help="index every feature's top examples, frequency and mean activation over a data set (Parquet)",
        description="Run the images through the model, encode the SAE's tokens and keep, for every feature, its "
        "top-k (image, token, activation), its activation frequency, mean activation and a histogram of its active "
        "values: one Parquet file, one row per feature (docs/sae.md, 'The feature index'). Memory holds one batch. "
        "An interrupted local run keeps OUT.partial.npz; the same command goes on from it (the Ray engine does not).",
    )
    ix.add_argument("--sae", required=True, help="an SAE folder or file (SAELens, ViT-Prisma, saev)")
    ix.add_argument("--model", default="demo", help="'demo', a hub id or a local folder")
    ix.add_argument("--data", required=True, metavar="FOLDER_OR_CSV", help="images, as `evaluate` reads them")
    ix.add_argument("--out", required=True, metavar="FILE.parquet")
    ix.add_argument("--top-k", type=int, default=16, help="examples kept per feature (default 16)")
    ix.add_argument("--point", default=None, help="the point, where the checkpoint does not say (saev)")
    ix.add_argument("--limit", type=int, default=None, help="use the first N usable images only")
    ix.add_argument("--size", type=int, nargs="+", metavar="PX", help="input size: one number (square) or H W")
    ix.add_argument(
        "--max-rows", type=int, default=None, help="rows of a CSV (files of a folder) read, as evaluate's (100,000)"
    )
    ix.add_argument("--batch", type=int, default=16, help="images per forward (default 16)")
    ix.add_argument(
        "--overwrite",
        action="store_true",
        help="replace --out even if it is not an index, and start over (ignore a checkpoint, OUT.partial.npz)",
    )
    ix.add_argument(
        "--engine", default="local", choices=("local", "ray"), help="local (default) or ray, as evaluate's engines"
    )
    ix.add_argument("--address", default=None, help="ray: a cluster to join (default: a local Ray)")
    ix.add_argument("--actors", type=int, default=None, help="ray: the actor pool's size (default: GPUs, else CPUs)")
    ix.add_argument("--device", default=None)
    ix.set_defaults(func=_index)

    td = cmds.add_parser(
        "train-demo",
        help="rebuild the bundled demo SAE (vitviz/assets/demo-sae) and its ground-truth table",
        description="Writes demo-data, trains the demo SAE with fixed settings and seed, measures it and the "
        "shapes' AUROC. Bit for bit with OMP_NUM_THREADS=1.",
    )
    td.add_argument("--out", default=None, help="default: the bundled folder vitviz/assets/demo-sae")
    td.add_argument(
        "--compare-blocks",
        action="store_true",
        help="instead: train a smaller SAE at each block's output and print the shapes' AUROC per block (writes "
        "nothing)",
    )
    td.set_defaults(func=_train_demo)

    idd = cmds.add_parser(
        "index-demo",
        help="rebuild the bundled index of the demo SAE (vitviz/assets/demo-sae-index)",
        description="Writes 200 demo-data images (seed 4) as JPEG, indexes the demo SAE's features over them and "
        "stores the examples' paths relative to the index.",
    )
    idd.add_argument("--out", default=None, help="a folder; default: the bundled vitviz/assets/demo-sae-index")
    idd.set_defaults(func=_index_demo)
