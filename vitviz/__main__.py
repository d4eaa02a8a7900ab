"""Command line: ``vitviz {app,export,evaluate,convert,demo-data,train-demo,sae} ...`` (or ``python -m vitviz ...``)."""

from __future__ import annotations

import argparse
import math
import signal
import sys
from pathlib import Path

from vitviz.cli_checks import (
    UsageError,
    check_against_model,
    check_output_folder,
    input_size,
    query_point,
    read_labels_file,
    terminal_text,
)
from vitviz.errors import VitvizError
from vitviz.insertion_starts import DEFAULT_INSERTION_START, INSERTION_STARTS

# How the user called us, for messages: the installed command or the module.
PROG = "vitviz" if Path(sys.argv[0]).name == "vitviz" else "python -m vitviz"


def _export(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from vitviz.capture.targets import Target
    from vitviz.export import export_images, print_failures
    from vitviz.models.load import load_model
    from vitviz.models.zeroshot import parse_labels, vocabulary_warning

    size = input_size(args.size)
    # Everything is checked before anything is created: the folder is made only once the model has loaded (its
    # problems are reported whatever the inputs) and at least one input exists: a typo never leaves an empty --out.
    check_output_folder(args.out, create=False)
    missing = [p for p in args.images if not Path(p).is_file()]
    loaded = load_model(args.model, device=args.device, dtype=args.dtype, allow_pickle=args.allow_pickle)
    labels = None
    if args.labels is not None:
        template = args.template if args.template is not None else (loaded.text.template if loaded.text else "{}")
        labels = parse_labels(args.labels, template)
        for note in labels.notes:
            print(f"note: {terminal_text(note)}", file=sys.stderr)
        if loaded.text is not None:
            unknown = vocabulary_warning(loaded.text, labels, args.model)
            if unknown:
                print(f"warning: {terminal_text(unknown)}", file=sys.stderr)
    check_against_model(loaded, size, args.class_index, labels=labels)
    sae, sae_features = _export_sae(args, loaded)
    if args.class_minus is not None:
        check_against_model(loaded, size, args.class_minus, labels=labels)
    target = None  # the flags as a Target (None: the top-1 class, or the top label of --labels)
    if args.class_index is not None:
        if labels is None:
            target = Target.of_class(args.class_index, args.class_minus)
        else:
            target = Target.of_label(labels, args.class_index, args.class_minus)
    if args.label is not None:
        for text in (args.label, args.label_minus):
            if text is not None and text not in labels.names:
                print(
                    terminal_text(
                        f"{PROG} export: error: --label {text!r} is not one of --labels ({', '.join(labels.names)})"
                    ),
                    file=sys.stderr,
                )
                return 2
        target = Target.of_label(labels, args.label, args.label_minus)
    present = [p for p in args.images if p not in missing]
    if not present:
        print(terminal_text(f"wrote 0 of {len(args.images)} images ({args.out} was not created)"))
        for p in missing:
            print(terminal_text(f"error: {p}: no such file"), file=sys.stderr)
        return 1
    check_output_folder(args.out)  # created now: the options, the model and the inputs are checked
    with tqdm(total=len(present), unit="img", desc="export", file=sys.stderr) as bar:
        report = export_images(
            loaded,
            present,
            args.out,
            size=size,
            batch_size=args.batch_size,
            query_xy=args.query_xy,
            labels=labels,
            causal=args.causal,
            target=target,
            patch_from=args.patch_from,
            methods=None if args.methods is None else [m.strip() for m in args.methods.split(",") if m.strip()],
            progress=bar.update,
            gif=args.gif,
            gif_head=args.gif_head,
            relevance_from_block=args.relevance_from_block,
            sae=sae,
            sae_features=sae_features,
        )
    report.failed[:0] = [(p, "no such file") for p in missing]
    print(terminal_text(f"wrote {len(report.written)} of {len(args.images)} images to {args.out}"))
    print_failures(report)
    return 1 if report.failed else 0


def _export_sae(args: argparse.Namespace, loaded):
    """``--sae DIR`` (and ``--features 3,17``, ``--sae-point``) -> the SAE, checked against the model, and the ids."""
    if args.sae is None:
        if args.features is not None or args.sae_point is not None:
            raise UsageError("--features and --sae-point need --sae")
        return None, None
    from vitviz.sae.load import load_sae

    sae = load_sae(args.sae, point=args.sae_point, loaded=loaded)
    ids = None
    if args.features is not None:
        try:
            ids = [int(v) for v in args.features.split(",") if v.strip()]
        except ValueError:
            raise UsageError(
                f"--features takes feature numbers separated by commas (3,17), got {args.features!r}"
            ) from None
        bad = [i for i in ids if not 0 <= i < sae.d_sae]
        if bad:
            raise UsageError(f"--features {bad}: the SAE has features 0..{sae.d_sae - 1}")
    return sae, ids


def _evaluate(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from vitviz.evaluate.run import evaluate_dataset, print_report

    methods = None if args.methods is None else [m.strip() for m in args.methods.split(",") if m.strip()]
    size = input_size(args.size)
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, initial=done, unit="img", desc="evaluate", file=sys.stderr)
        bar.update(done - bar.n)

    def stop(signum, frame) -> None:  # a scheduler's SIGTERM stops the run as Ctrl-C does: finished images kept
        raise KeyboardInterrupt

    try:
        before = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (main() called from a thread): leave signals alone
        before = None
    try:
        report = evaluate_dataset(
            args.model,
            args.data,
            args.out,
            methods=methods,
            limit=args.limit,
            **({"max_rows": args.max_rows} if args.max_rows is not None else {}),
            **({"max_files": args.max_files} if args.max_files is not None else {}),
            size=size,
            seed=args.seed,
            engine=args.engine,
            address=args.address,
            batch_size=args.batch_size,
            device=args.device,
            progress=progress,
            ray_actors=args.actors,
            overwrite=args.overwrite,
            insertion_start=args.insertion_start,
            relevance_from_block=args.relevance_from_block,
            labels=args.labels,
            template=args.template,
        )
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)
        if bar is not None:
            bar.close()
    print_report(report)
    if report.evaluated:
        from vitviz.evaluate.results import remember_last_run

        remember_last_run(report.out)
    return 1 if report.skipped else 0


def _demo_data(args: argparse.Namespace) -> int:
    from vitviz.data.shapes import write_dataset

    check_output_folder(args.out)
    csv_path = write_dataset(args.out, n=args.n, seed=args.seed)
    print(f"wrote {args.n} images and {csv_path}")
    return 0


# Per architecture: the trainer, its bundled folder, its default steps, and the goals its score must meet.
_DEMO_GOALS = {"vit": (0.95, 0.90), "swin": (0.95, 0.85), "clip": (0.90, 0.80)}


def _train_demo(args: argparse.Namespace) -> int:
    if args.arch == "swin":
        from vitviz.demo.swin import SWIN_DEMO_DIR as folder
        from vitviz.demo.swin import train_swin_demo as train
    elif args.arch == "clip":
        from vitviz.demo.clip import CLIP_DEMO_DIR as folder
        from vitviz.demo.clip import train_clip_demo as train
    else:
        from vitviz.demo.vit import DEMO_DIR as folder
        from vitviz.demo.vit import train_demo as train
    out = _demo_out(args, Path(folder))
    steps = args.steps or (1000 if args.arch == "clip" else 2000)
    sizes = {} if args.train_images is None else {"train_images": args.train_images, "held_out": args.held_out}
    if args.label_smoothing is not None:
        if args.arch != "vit":
            raise UsageError(f"--label-smoothing is for --arch vit (the {args.arch} trainer keeps its own)")
        if not 0.0 <= args.label_smoothing < 1.0:
            raise UsageError(f"--label-smoothing must be in [0, 1), got {args.label_smoothing}")
        sizes["label_smoothing"] = args.label_smoothing
    if args.lr is not None:
        if not (math.isfinite(args.lr) and args.lr > 0):
            raise UsageError(f"--lr must be a positive number, got {args.lr}")
        sizes["lr"] = args.lr
    score = train(out, seed=args.seed, steps=steps, batch_size=args.batch_size, **sizes)
    accuracy, in_box = _DEMO_GOALS[args.arch]
    return 0 if score.accuracy >= accuracy and score.peak_in_box >= in_box else 1


def _demo_out(args: argparse.Namespace, bundled: Path) -> Path:
    """Where ``train-demo`` writes: ``--out``, or the bundled model's own folder with ``--overwrite-bundled``;
    a folder inside the bundled one needs ``--overwrite-bundled`` too (it is the installed package's)."""
    if args.out is None:
        if not args.overwrite_bundled:
            raise UsageError(
                f"train-demo writes a new model folder: give --out FOLDER (load it with --model FOLDER), or "
                f"--overwrite-bundled to replace the bundled model in {bundled}."
            )
        return bundled
    out = Path(args.out)
    if out.resolve().is_relative_to(bundled.resolve()) and not args.overwrite_bundled:
        raise UsageError(
            f"--out {out} is inside the bundled model's folder ({bundled}): choose another folder, or give "
            "--overwrite-bundled to replace the bundled model."
        )
    return out


def _convert(args: argparse.Namespace) -> int:
    from vitviz.zoo.convert import convert, official_names

    if args.list:
        print("\n".join(official_names()))
        return 0
    if not (args.arch and args.checkpoint and args.out):
        print(
            f"{PROG} convert: error: --arch, --checkpoint and --out are required (--list shows the names)",
            file=sys.stderr,
        )
        return 2
    check_output_folder(args.out, must_be_empty=True, create=False)
    npz_only = [opt for opt, v in (("--variant", args.variant), ("--num-classes", args.num_classes)) if v is not None]
    if npz_only and args.arch != "vit-npz":
        raise UsageError(f"{' and '.join(npz_only)} apply to --arch vit-npz only")
    if args.arch == "vit-npz":
        from vitviz.zoo.vit_npz import convert_vit_npz

        if args.num_classes is not None and args.num_classes < 1:
            raise UsageError(f"--num-classes must be at least 1, got {args.num_classes}")
        report = convert_vit_npz(
            args.checkpoint,
            args.out,
            variant=args.variant,
            num_classes=args.num_classes,
            labels=read_labels_file(args.labels) if args.labels else None,
        )
        for note in report.notes:
            print(f"note: {note}", file=sys.stderr)
        checked = f", checked against {report.variant}" if report.variant else ""
        print(
            f"wrote {report.out} ({report.model_class}, {report.layout.image_size} px{checked}): "
            f"load it with --model {report.out}"
        )
        return 0
    if args.arch == "open_clip":
        from vitviz.zoo.open_clip import convert_open_clip

        report = convert_open_clip(args.checkpoint, args.out)
        for note in report.notes:
            print(f"note: {terminal_text(note)}", file=sys.stderr)
        print(terminal_text(f"wrote {report.out} (an HF CLIP folder): load it with --model {report.out}"))
        return 0
    labels = None
    if args.labels:
        labels = read_labels_file(args.labels)
    out = convert(args.arch, args.checkpoint, args.out, labels=labels)
    print(f"wrote {out} (model.safetensors, config.json, preprocessor_config.json): load it with --model {out}")
    return 0


def _xy(text: str) -> tuple[float, float]:
    try:
        return query_point(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _app(args: argparse.Namespace) -> int:
    from vitviz.launch import run_app

    return run_app(args.port, args.address)


def build_parser() -> argparse.ArgumentParser:
    import vitviz

    parser = argparse.ArgumentParser(prog=PROG, description="Look inside Vision Transformers.")
    parser.add_argument("--version", action="version", version=f"vitviz {vitviz.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    ex = sub.add_parser("export", help="write attention, rollout and summaries of images as .npz + PNG")
    ex.add_argument("--model", default="demo", help="'demo', a hub id (owner/name) or a local folder")
    ex.add_argument("--out", required=True, help="output folder")
    ex.add_argument("--size", type=int, nargs="+", metavar="PX", help="input size: one number (square) or H W")
    ex.add_argument("--batch-size", type=int, default=8)
    ex.add_argument(
        "--query-xy",
        type=_xy,
        default=None,
        metavar="X,Y",
        help="query token: the one whose cell holds pixel (X, Y) of the model input (default: CLS, else the centre)",
    )
    ex.add_argument("--labels", default=None, help='zero-shot models: labels, comma-separated ("cat,dog,car")')
    ex.add_argument(
        "--template",
        default=None,
        help='prompt made from each label, {} is the label (default: the model\'s own, else "a photo of a {}."; '
        '"{}" uses the labels as they are)',
    )
    ex.add_argument(
        "--causal",
        action="store_true",
        help="add logit_lens, head_ablation (zero knock-out), head/mlp attribution and explained_class",
    )
    ex.add_argument(
        "--class",
        dest="class_index",
        type=int,
        default=None,
        metavar="C",
        help="with --causal or --methods: the class explained (default: the top-1)",
    )
    ex.add_argument(
        "--methods",
        default=None,
        metavar="M1,M2",
        help="also write method_<name>: explanation maps on the patch grid (e.g. attnlrp,rollout,relevance); "
        "attnlrp is the paper's rules (the default AttnLRP), attnlrp_cp CP-LRP inside attention (lxt's ViT recipe)",
    )
    ex.add_argument(
        "--class-minus",
        dest="class_minus",
        type=int,
        default=None,
        metavar="C2",
        help="with --causal: explain logit[C] - logit[C2] (C: --class, else the top-1)",
    )
    ex.add_argument(
        "--label",
        default=None,
        metavar="TEXT",
        help="with --causal, zero-shot models: the label explained (one of --labels; default: the top-1)",
    )
    ex.add_argument(
        "--label-minus",
        default=None,
        metavar="TEXT",
        help="with --causal and --label: explain score[--label] - score[TEXT] (one of --labels)",
    )
    ex.add_argument(
        "--patch-from",
        default=None,
        metavar="SOURCE",
        help="with --causal and one IMAGE: patch SOURCE's activations into IMAGE's run (patching_* arrays)",
    )
    ex.add_argument(
        "--gif",
        nargs="?",
        const="rollout",
        default=None,
        choices=("rollout", "mean", "head"),
        help="also write <stem>_<view>.gif stepping through the blocks: rollout up to each block (the default), "
        "the mean of heads, or one head (--gif-head)",
    )
    ex.add_argument("--gif-head", type=int, default=0, metavar="H", help="with --gif head: the head shown")
    ex.add_argument(
        "--relevance-from-block",
        type=int,
        default=0,
        metavar="K",
        help="with --labels: prompt-word relevance runs through text blocks K..last (default 0: all blocks; "
        "-1: the last only)",
    )
    ex.add_argument(
        "--sae",
        default=None,
        metavar="DIR",
        help="also write sae_*: an SAE's features (SAELens folder, ViT-Prisma or saev checkpoint; e.g. the bundled "
        "vitviz/assets/demo-sae for --model demo)",
    )
    ex.add_argument(
        "--features",
        default=None,
        metavar="F1,F2",
        help="with --sae: the features mapped in sae_feature_maps (default: the image's 8 most active)",
    )
    ex.add_argument("--sae-point", default=None, help="with --sae: its point, where the checkpoint does not say (saev)")
    ex.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    ex.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    ex.add_argument("--allow-pickle", action="store_true", help="accept pickle-only checkpoints (runs their code!)")
    ex.add_argument("images", nargs="+", metavar="IMAGE")
    ex.set_defaults(func=_export)

    ev = sub.add_parser(
        "evaluate", help="faithfulness (deletion / insertion) of explanation methods over a data set, as Parquet"
    )
    ev.add_argument("--model", default="demo", help="'demo', a hub id (owner/name) or a local folder")
    ev.add_argument(
        "--data",
        required=True,
        metavar="FOLDER_OR_CSV",
        help="a folder of images, or a CSV file,label,x0,y0,x1,y1 (as demo-data writes)",
    )
    ev.add_argument("--out", required=True, metavar="RESULTS.parquet", help="the results file (one Parquet file)")
    ev.add_argument(
        "--methods",
        default=None,
        metavar="M1,M2",
        help="comma-separated methods (default: all that apply): attention, rollout, relevance, "
        "gradcam, integrated_gradients, attnlrp (the paper's rules), random; also attnlrp_cp (AttnLRP with "
        "CP-LRP inside attention, lxt's ViT recipe; not among the defaults)",
    )
    ev.add_argument("--limit", type=int, default=None, metavar="N", help="evaluate the first N images only")
    ev.add_argument(
        "--max-rows",
        type=int,
        default=None,
        metavar="N",
        help="read at most N rows of a --data CSV (or files of a folder), saying so when there are more "
        "(default 100,000)",
    )
    ev.add_argument(
        "--max-files",
        type=int,
        default=None,
        metavar="N",
        help="list at most N entries (files, folders, links) of a --data folder, sub-folders included, saying how "
        "many were not listed (default 1,000,000)",
    )
    ev.add_argument("--size", type=int, nargs="+", metavar="PX", help="input size: one number (square) or H W")
    ev.add_argument("--seed", type=int, default=0, help="seed of the random baseline (per image: seed and image id)")
    ev.add_argument(
        "--engine",
        default="local",
        choices=("local", "ray"),
        help="local: this process; ray: a Ray Data pipeline with a pool of model actors",
    )
    ev.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="with --engine ray: the cluster to join (e.g. auto, ray://host:10001); default: a local Ray",
    )
    ev.add_argument(
        "--actors",
        type=int,
        default=None,
        metavar="N",
        help="with --engine ray: model actors (default: one per GPU, else one per CPU)",
    )
    ev.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --out (and unfinished work) of other settings; without it such a run is refused",
    )
    ev.add_argument(
        "--insertion-start",
        default=DEFAULT_INSERTION_START,
        choices=INSERTION_STARTS,
        help="what the insertion curve starts from: the image blurred, its mean colour, a fixed grey, or "
        "seeded noise (default: mean; blur keeps colour, so it is flat where colour is the evidence)",
    )
    ev.add_argument("--batch-size", type=int, default=20, help="perturbed images per forward pass")
    ev.add_argument(
        "--labels",
        default=None,
        help='zero-shot models: the labels each image is scored against, comma-separated ("circle,square,star"); '
        "each image is explained for the label the model picks",
    )
    ev.add_argument(
        "--template",
        default=None,
        help="with --labels: prompt template, {} is the label (default: the model's own, e.g. 'a photo of a {}.')",
    )
    ev.add_argument(
        "--relevance-from-block",
        type=int,
        default=0,
        metavar="K",
        help="relevance runs through blocks K..last (default 0: all blocks, MM-Explainability's start_layer=0; "
        "-1: the last block only, its CLIP notebook's default)",
    )
    ev.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    ev.set_defaults(func=_evaluate)

    cv = sub.add_parser(
        "convert",
        help="an official CCT / T2T-ViT / DAT checkpoint (.pth state dict), or the ViT paper's JAX .npz "
        "(plain or hybrid ViT) -> a folder vitviz loads",
    )
    cv.add_argument(
        "--arch",
        metavar="NAME",
        help="official model name, e.g. cct_14_7x2_224 (see --list); open_clip (--checkpoint: an open_clip folder); "
        "vit-npz (--checkpoint: one of the ViT paper's .npz files, e.g. R50+ViT-B_16.npz)",
    )
    cv.add_argument(
        "--checkpoint",
        metavar="FILE.pth",
        help="the authors' checkpoint (.pth read with weights_only=True; .npz read with allow_pickle=False)",
    )
    cv.add_argument("--out", metavar="FOLDER", help="the folder to write (must not exist or be empty)")
    cv.add_argument("--labels", metavar="FILE.txt", help="class names, one per line (default: LABEL_0, ...)")
    cv.add_argument(
        "--variant",
        metavar="NAME",
        help="vit-npz: the vit_jax model name to check the arrays against, e.g. R50+ViT-B_16 or R26_S_32 "
        "(default: the name in the file name, if any)",
    )
    cv.add_argument(
        "--num-classes",
        type=int,
        metavar="N",
        help="vit-npz: the classes the head must have (e.g. 1000 for an ImageNet-1k fine-tune; refused otherwise)",
    )
    cv.add_argument("--list", action="store_true", help="list the official model names and exit")
    cv.set_defaults(func=_convert)

    dd = sub.add_parser("demo-data", help="write the demo model's synthetic shapes and labels.csv")
    dd.add_argument("--n", type=int, required=True)
    dd.add_argument("--seed", type=int, default=0)
    dd.add_argument("--out", required=True)
    dd.set_defaults(func=_demo_data)

    tr = sub.add_parser(
        "train-demo", help="train a bundled demo model on the shapes (CPU: vit ~15, swin ~30, clip ~10 minutes)"
    )
    tr.add_argument(
        "--arch",
        default="vit",
        choices=tuple(_DEMO_GOALS),
        help="vit: 'demo'; swin: 'demo-swin'; clip: 'demo-clip' (zero-shot, own tokenizer)",
    )
    tr.add_argument("--out", default=None, help="output folder (required unless --overwrite-bundled)")
    tr.add_argument(
        "--overwrite-bundled",
        action="store_true",
        help="write over the bundled model of --arch in the installed package (without --out)",
    )
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--steps", type=int, default=None, help="default: 2000 (vit, swin), 1000 (clip)")
    tr.add_argument("--train-images", type=int, default=None, help="training images (default: the trainer's)")
    tr.add_argument("--held-out", type=int, default=500, help="held-out images scored (with --train-images)")
    tr.add_argument("--batch-size", type=int, default=64)
    tr.add_argument(
        "--label-smoothing",
        type=float,
        default=None,
        help="vit only: the loss's label smoothing (default 0, the bundled demo's)",
    )
    tr.add_argument(
        "--lr",
        type=float,
        default=None,
        help="peak learning rate (default: the trainer's; vit 3e-4, swin and clip 1e-3)",
    )
    tr.set_defaults(func=_train_demo)

    ap = sub.add_parser(
        "app",
        help="start the web app (Streamlit); it prints its address: open it in a browser",
        description="Start the web app (Streamlit). It opens no browser (it may run on a server): it prints its "
        "address, which you open in a browser. Ctrl-C or SIGTERM stops it.",
    )
    ap.add_argument("--port", type=int, default=8501, help="port to listen on (default 8501)")
    ap.add_argument(
        "--address",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for every interface)",
    )
    ap.set_defaults(func=_app)

    from vitviz.sae.cli import add_parser as add_sae_parser

    add_sae_parser(sub)
    return parser


def _export_usage(args: argparse.Namespace) -> str:
    """What is wrong with an ``export`` command line's target and patching options ("" when nothing)."""
    if args.patch_from is not None and not args.causal:
        return "--patch-from needs --causal (patching is a causal analysis)"
    if args.patch_from is not None and len(args.images) != 1:
        return f"--patch-from patches one source into one target image; {len(args.images)} images were given"
    if args.class_minus is not None and not args.causal:
        return "--class-minus needs --causal"
    if args.class_minus is not None and args.class_index is None:
        return "--class-minus needs --class (the class it is subtracted from)"
    if args.label_minus is not None and args.label is None:
        return "--label-minus needs --label"
    if args.label is not None:
        if args.labels is None:
            return "--label needs --labels (the label must be one of them)"
        if args.class_index is not None or args.class_minus is not None:
            return "give either --class/--class-minus (a classifier) or --label (a zero-shot model), not both"
        if not args.causal:
            return "--label needs --causal"
    if args.class_minus is not None and args.class_minus == args.class_index:
        return "--class-minus must differ from --class"
    return ""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "batch_size", 1) < 1:
        print(f"{PROG}: error: --batch-size must be at least 1", file=sys.stderr)
        return 2
    why = _export_usage(args) if args.command == "export" else ""
    if why:
        print(f"{PROG} export: error: {why}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except UsageError as exc:  # messages quote what was typed or read: control characters escaped, length bounded
        print(f"{PROG}: error: {terminal_text(exc)}", file=sys.stderr)
        return 2
    except VitvizError as exc:
        print(f"{PROG}: error: {terminal_text(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; files already written are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
