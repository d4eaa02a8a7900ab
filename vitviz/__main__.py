"""Command line: ``python -m vitviz {export,demo-data,train-demo} ...``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitviz.errors import VitvizError

PROG = "python -m vitviz"


def _export(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from vitviz.export import export_images, print_failures
    from vitviz.models.load import load_model
    from vitviz.models.zeroshot import parse_labels

    missing = [p for p in args.images if not Path(p).is_file()]
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, allow_pickle=args.allow_pickle)
    labels = None
    if args.labels is not None:
        template = args.template if args.template is not None else (loaded.text.template if loaded.text else "{}")
        labels = parse_labels(args.labels, template)
        for note in labels.notes:
            print(f"note: {note}", file=sys.stderr)
    size = None if args.size is None else (args.size[0] if len(args.size) == 1 else tuple(args.size))
    present = [p for p in args.images if p not in missing]
    with tqdm(total=len(present), unit="img", desc="export", file=sys.stderr) as bar:
        report = export_images(
            loaded, present, args.out, size=size, batch_size=args.batch_size, query_xy=args.query_xy,
            labels=labels, causal=args.causal, class_index=args.class_index, progress=bar.update,
        )  # fmt: skip
    report.failed[:0] = [(p, "no such file") for p in missing]
    print(f"wrote {len(report.written)} of {len(args.images)} images to {args.out}")
    print_failures(report)
    return 1 if report.failed else 0


def _demo_data(args: argparse.Namespace) -> int:
    from vitviz.data.shapes import write_dataset

    csv_path = write_dataset(args.out, n=args.n, seed=args.seed)
    print(f"wrote {args.n} images and {csv_path}")
    return 0


def _train_demo(args: argparse.Namespace) -> int:
    from vitviz.demo.vit import DEMO_DIR, train_demo

    score = train_demo(args.out or DEMO_DIR, seed=args.seed, steps=args.steps, batch_size=args.batch_size)
    return 0 if score.accuracy >= 0.95 and score.peak_in_box >= 0.9 else 1


def _xy(text: str) -> tuple[float, float]:
    try:
        x, y = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected X,Y in pixels of the model input, got {text!r}") from None
    return x, y


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Look inside Vision Transformers.")
    sub = parser.add_subparsers(dest="command", required=True)

    ex = sub.add_parser("export", help="write attention, rollout and summaries of images as .npz + PNG")
    ex.add_argument("--model", default="demo", help="'demo', a hub id (owner/name) or a local folder")
    ex.add_argument("--out", required=True, help="output folder")
    ex.add_argument("--size", type=int, nargs="+", metavar="PX", help="input size: one number (square) or H W")
    ex.add_argument("--batch-size", type=int, default=8)
    ex.add_argument(
        "--query-xy", type=_xy, default=None, metavar="X,Y",
        help="query token: the one whose cell holds pixel (X, Y) of the model input (default: CLS, else the centre)",
    )  # fmt: skip
    ex.add_argument("--labels", default=None, help='zero-shot models: labels, comma-separated ("cat,dog,car")')
    ex.add_argument(
        "--template", default=None,
        help='prompt made from each label, {} is the label (default: the model\'s own, else "a photo of a {}."; '
        '"{}" uses the labels as they are)',
    )  # fmt: skip
    ex.add_argument(
        "--causal", action="store_true",
        help="add logit_lens, head_ablation (zero knock-out), head/mlp attribution and explained_class",
    )  # fmt: skip
    ex.add_argument("--class", dest="class_index", type=int, default=None, metavar="C",
                    help="with --causal: the class explained (default: the top-1)")  # fmt: skip
    ex.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    ex.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    ex.add_argument("--allow-pickle", action="store_true", help="accept pickle-only checkpoints (runs their code!)")
    ex.add_argument("images", nargs="+", metavar="IMAGE")
    ex.set_defaults(func=_export)

    dd = sub.add_parser("demo-data", help="write the demo model's synthetic shapes and labels.csv")
    dd.add_argument("--n", type=int, required=True)
    dd.add_argument("--seed", type=int, default=0)
    dd.add_argument("--out", required=True)
    dd.set_defaults(func=_demo_data)

    tr = sub.add_parser("train-demo", help="train the bundled demo ViT (CPU: about 15 minutes)")
    tr.add_argument("--out", default=None, help="output folder (default: the bundled model's folder)")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--steps", type=int, default=2000)
    tr.add_argument("--batch-size", type=int, default=64)
    tr.set_defaults(func=_train_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "batch_size", 1) < 1:
        print(f"{PROG}: error: --batch-size must be at least 1", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except VitvizError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; files already written are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
