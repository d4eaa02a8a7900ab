"""Benchmark vitviz against the model's own forward pass; prints a table and writes JSON.

    python -m benchmarks [--quick] [--skip-browser] [--sections overhead,zeroshot,...] [--out benchmarks/results.json]

Sections (all by default): ``overhead`` (ViT-B/16, DINOv2-base at 518, Swin-T: full analysis
against the plain SDPA forward, records, DINOv2's peak memory), ``interaction`` (Heads page
reruns), ``export``, ``browser``, ``zeroshot`` (CLIP ViT-B/16, SigLIP-base: overhead and label
change; ``benchmarks/zeroshot.py``), ``causal`` (head importance in forward-equivalents, fast
vs exact rank correlation on 50 demo images; ``benchmarks/causal.py``), ``patching`` (activation
patching in forward-equivalents, estimate vs exact on 50 demo image pairs; ``benchmarks/patching.py``), ``faithfulness``
(deletion + insertion of one ViT-B/16 image over one forward; ``benchmarks/faithfulness.py``),
``evaluate`` (``python -m vitviz evaluate`` throughput, local vs Ray; ``benchmarks/evaluate.py``),
``headview`` (the instant head view in Chromium: input -> redraw, payload; ``benchmarks/headview.py``),
``compare_open`` (*Compare explanations*' first open on demo over one forward; ``benchmarks/compare_open.py``),
``side_by_side`` (the Side by side page with two models against the one-pane Heads page: reruns, a synced click,
a new image; ``benchmarks/side_by_side.py``), ``hybrid`` (R50+ViT-B/16 at 384 px: the Run against the plain
forward, a ViT-B/16 at 384 as control; ``benchmarks/hybrid.py``), ``hiera`` (Hiera-B at 224: the Run's full
analysis against plain inference; ``benchmarks/hiera.py``).
With ``--sections``, the sections not run keep their figures from an existing ``--out`` file.

Random weights throughout (speed does not depend on them). Every ratio compares
two timings taken in the same run on the same machine; medians of several runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import MODELS, full_analysis, make_model, median_time, overhead  # noqa: E402,F401
from vitviz.models.load import load_model  # noqa: E402

_PEAK = """
import resource, sys, numpy as np, torch
from PIL import Image
sys.path.insert(0, {root!r})
from vitviz.models.load import load_model
from vitviz.capture.forward import capture, preprocess
loaded = load_model({folder!r})
image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8))
pixels, _ = preprocess(loaded, [image], loaded.default_size)
with torch.inference_mode():
    loaded.model(pixel_values=pixels)  # allocator warm: what remains is the capture's own peak
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if {mode!r} == "output_attentions":  # how vitviz captured before the hooks: every layer's float32 kept
    with torch.inference_mode():
        out = loaded.model(pixel_values=pixels, output_attentions=True)
        stack = np.stack([a.to(torch.float16).numpy() for a in out.attentions])
else:
    cap = capture(loaded, image)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)
"""


def peak_memory(folder: Path) -> dict:
    """Peak resident memory a capture adds, in a fresh process each: hooks vs the old ``output_attentions`` stack."""
    import subprocess

    out = {}
    for mode in ("output_attentions", "hooks"):
        code = _PEAK.format(root=str(ROOT), folder=str(folder), mode=mode)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        out[f"{mode}_peak_MiB"] = round(float(res.stdout.strip().splitlines()[-1]))
    return out


def interaction(folder: Path, runs: int) -> dict:
    """Server-side rerun of the Heads page after a layer / head / patch change (AppTest, no forward pass)."""
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.testing.v1 import AppTest

    # A running server leaves Streamlit's legacy pages-folder mode once, at its first
    # run; AppTest re-enters it on every run, which would time the page twice.
    original = PagesManager.__init__

    def steady_state(self, *args, **kwargs):
        original(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    PagesManager.__init__ = steady_state
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=300)
    at.session_state["model_name"] = str(folder)
    at.session_state["instant_heads"] = False  # the server-drawn view: the instant view's changes make no rerun
    at.run()
    at.switch_page("pages/heads.py").run()
    assert not at.exception, at.exception
    timings = {"layer": [], "head": [], "patch": []}
    for i in range(runs):
        for what in timings:
            t = time.perf_counter()
            if what == "layer":
                at.slider(key="_w_layer").set_value(i % 12).run()
            elif what == "head":
                at.radio(key="_w_head").set_value((i * 5) % 12).run()
            else:
                at.session_state["query"] = 1 + (i * 37) % 196
                at.run()
            timings[what].append(time.perf_counter() - t)
            assert not at.exception, at.exception
    return {f"{k}_ms": round(1000 * statistics.median(v), 1) for k, v in timings.items()}


def export_throughput(folder: Path, n: int) -> dict:
    from vitviz.export import export_images

    loaded = load_model(str(folder))
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(n):
            p = Path(tmp) / f"img{i:02d}.jpg"
            Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(p)
            paths.append(p)
        export_images(loaded, paths[:2], Path(tmp) / "warm", batch_size=2)
        out = {}
        for bs in (1, 8):
            t = time.perf_counter()
            export_images(loaded, paths, Path(tmp) / f"b{bs}", batch_size=bs)
            out[f"batch{bs}_img_per_s"] = round(n / (time.perf_counter() - t), 2)
    out["batched_vs_single"] = round(out["batch8_img_per_s"] / out["batch1_img_per_s"], 2)
    return out


def browser(folder: Path) -> dict:
    """Upload -> first attention figure, and layer change -> all head maps drawn (Chromium via Playwright)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import subprocess
    import urllib.request

    from browser_tools import CHROMIUM, FLAGS, PLOTS, choose_model, free_port, server_heads, settle, wait_for_title
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            "app.py",
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    photo = ROOT / "assets" / "examples" / "cat-chelsea.jpg"
    heads_drawn = f"""() => Array.from(document.querySelectorAll("{PLOTS}")).some(el =>
        ((el.layout || {{}}).annotations || []).length === 12 && el.querySelector(".hm image"))"""
    try:
        for _ in range(180):
            try:
                urllib.request.urlopen(f"{url}/_stcore/health", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = b.new_page(viewport={"width": 1500, "height": 1100})
            page.goto(url)
            wait_for_title(page, "Top predictions", timeout=120)
            settle(page)  # a widget swapped in by a still-running script would swallow the click
            choose_model(page, "other (hub id or local folder)…")
            box = page.get_by_label("Hub id or local folder")
            box.fill(str(folder))
            box.press("Enter")
            page.wait_for_selector("text=12 layers x 12 heads", timeout=120_000)
            page.get_by_role("link", name="Heads").click()
            server_heads(page)  # the server-drawn view, as measured before the instant view existed
            page.wait_for_function(heads_drawn, timeout=120_000)
            page.wait_for_timeout(1000)
            grid_z = f"""() => JSON.stringify(Array.from(document.querySelectorAll("{PLOTS}"))
                .filter(el => ((el.layout || {{}}).annotations || []).length === 12).map(el => el.data[0].z))"""
            before = page.evaluate(grid_z)
            t = time.perf_counter()
            page.get_by_test_id("stFileUploaderDropzoneInput").set_input_files(str(photo))
            page.wait_for_function(
                f"(before) => ({grid_z})() !== before && ({heads_drawn})()", arg=before, timeout=120_000, polling=20
            )
            upload_s = time.perf_counter() - t
            page.wait_for_timeout(1000)
            slider = page.get_by_test_id("stSlider").filter(has_text="Block").get_by_role("slider")
            layer_times = []
            for key in ("Home", "ArrowRight", "ArrowRight"):
                before = page.evaluate(
                    f"""() => JSON.stringify(Array.from(document.querySelectorAll("{PLOTS}")).map(el => (el.data||[]).map(t => t.z)))"""
                )
                slider.focus()
                t = time.perf_counter()
                slider.press(key)
                page.wait_for_function(
                    f"""(before) => JSON.stringify(Array.from(document.querySelectorAll("{PLOTS}")).map(el => (el.data||[]).map(t => t.z))) !== before""",
                    arg=before,
                    timeout=60_000,
                    polling=20,
                )
                page.wait_for_function(heads_drawn, timeout=60_000)
                layer_times.append(time.perf_counter() - t)
                page.wait_for_timeout(800)
            b.close()
        return {
            "upload_to_maps_s": round(upload_s, 2),
            "layer_change_to_all_heads_s": round(statistics.median(layer_times), 2),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=20)


SECTIONS = (
    "overhead",
    "interaction",
    "export",
    "browser",
    "zeroshot",
    "causal",
    "patching",
    "faithfulness",
    "evaluate",
    "headview",
    "imports",
    "attnlrp",
    "compare_open",
    "side_by_side",
    "hybrid",
    "hiera",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--quick", action="store_true", help="fewer runs")
    parser.add_argument("--skip-browser", action="store_true")
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {', '.join(SECTIONS)}")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results.json"))
    args = parser.parse_args(argv)
    sections = {x.strip() for x in args.sections.split(",") if x.strip()}
    if unknown := sections - set(SECTIONS):
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if args.skip_browser or not Path("/usr/bin/chromium").exists():
        sections.discard("browser")
    runs = 3 if args.quick else 9
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(args.out)
    results: dict = json.loads(out.read_text()) if out.is_file() and sections != set(SECTIONS) else {}
    results.update(
        {
            "device": device,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}",
            "torch_threads": torch.get_num_threads(),
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        vit = make_model("vit-b16-224", Path(tmp) / "vit")
        if "overhead" in sections:
            dino = make_model("dinov2-base-518", Path(tmp) / "dino")
            swin = make_model("swin-t-224", Path(tmp) / "swin")
            results["overhead"] = [
                overhead("vit-b16-224", vit, runs),
                overhead("dinov2-base-518", dino, max(2, runs // 2)),
                overhead("swin-t-224", swin, runs),
            ]
            results["dinov2_518_peak_memory"] = peak_memory(dino)
        if "interaction" in sections:
            results["interaction"] = interaction(vit, runs)
        if "export" in sections:
            results["export"] = export_throughput(vit, 32)
        if "browser" in sections:
            results["browser"] = browser(vit)
        if "zeroshot" in sections:
            from benchmarks import zeroshot

            results["zeroshot"] = {"overhead": [], "label_change": []}
            for kind in zeroshot.MODELS:
                folder = zeroshot.make_zero_shot(kind, Path(tmp) / kind)
                results["zeroshot"]["overhead"].append(zeroshot.overhead(kind, folder, runs))
                results["zeroshot"]["label_change"].append(zeroshot.label_change(kind, folder, runs))
        if "causal" in sections:
            from benchmarks import causal

            results["causal"] = {
                "head_importance_cost": causal.head_importance_cost(vit, runs=max(2, runs // 3)),
                "one_run": causal.one_run_views(vit, runs=max(2, runs // 3)),
                "fast_vs_exact": causal.fast_vs_exact_rank_correlation(50, mode="mean"),
            }
        if "side_by_side" in sections:
            from benchmarks.side_by_side import side_by_side

            results["side_by_side"] = side_by_side(max(5, runs))
        if "patching" in sections:
            from benchmarks import patching

            results["patching"] = {
                "cost": patching.patching_cost(vit, runs=max(1, runs // 3)),
                "estimate": patching.estimate_cost(vit, runs=max(3, runs // 3)),
                "estimate_vs_exact": patching.estimate_vs_exact(50),
            }
        if "faithfulness" in sections:
            from benchmarks import faithfulness

            results["faithfulness"] = faithfulness.curves_cost(vit, runs=max(2, runs // 3))
        if "evaluate" in sections:
            from benchmarks import evaluate

            results["evaluate"] = evaluate.evaluate_throughput(40)
        if "headview" in sections and Path("/usr/bin/chromium").exists():
            from benchmarks import headview

            results["headview"] = headview.head_view_timings(vit)
            if "browser" in results:  # the app's upload -> maps in Chromium, measured in this run
                hv = results["headview"]
                hv["app_browser_upload_to_maps_s"] = results["browser"]["upload_to_maps_s"]
                hv["show_over_app_browser"] = round(hv["show_first_draw_s"] / hv["app_browser_upload_to_maps_s"], 2)
        if "imports" in sections:
            from benchmarks import imports

            results["imports"] = imports.import_times(3 if args.quick else 7)
        if "attnlrp" in sections:
            from benchmarks import attnlrp

            results["attnlrp"] = attnlrp.attnlrp_cost(vit, runs=max(2, runs // 3))
        if "compare_open" in sections:
            from benchmarks import compare_open

            results["compare_open"] = compare_open.compare_first_open(max(2, runs // 3))
        if "hybrid" in sections:
            from benchmarks import hybrid

            results["hybrid"] = hybrid.hybrid_overhead(max(2, runs // 3))
        if "hiera" in sections:
            from benchmarks import hiera

            results["hiera"] = hiera.overhead(hiera.make_hiera(Path(tmp) / "hiera"), runs)
    results["peak_rss_MiB"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    out.write_text(json.dumps(results, indent=2))
    print_table(results)
    return 0


def print_table(r: dict) -> None:
    print(f"\nvitviz benchmark on {r['device']} ({r['machine']})\n")
    rows = [*r.get("overhead", []), *r.get("zeroshot", {}).get("overhead", []), *([r["hiera"]] if "hiera" in r else [])]
    if rows:
        print(
            "| model | tokens (all stages) | blocks | plain inference (s) | vitviz full analysis (s) | overhead ratio "
            "| record (MiB) |"
        )
        print("|---|---|---|---|---|---|---|")
        for o in rows:
            print(
                f"| {o['model']} | {o['tokens']} | {o.get('blocks', '')} | {o['plain_s']} | {o['vitviz_s']} "
                f"| {o['overhead_ratio']} | {o['record_MiB']} ({o['attention_precision']}) |"
            )
    if m := r.get("dinov2_518_peak_memory"):
        print(
            f"\nDINOv2-base at 518 px, peak memory a capture adds: {m['hooks_peak_MiB']} MiB with the hooks, "
            f"{m['output_attentions_peak_MiB']} MiB keeping output_attentions' float32 stack"
        )
    for lc in r.get("zeroshot", {}).get("label_change", []):
        print(
            f"{lc['model']}: 10 new labels {lc['label_change_ms']} ms, one label edited {lc['one_label_edited_ms']} ms"
        )
    if i := r.get("interaction"):
        print(
            f"\nHeads page rerun, 12 heads, no forward pass: layer {i['layer_ms']} ms, head {i['head_ms']} ms, "
            f"patch {i['patch_ms']} ms"
        )
    if b := r.get("browser"):
        print(
            f"Browser: upload -> all head maps {b['upload_to_maps_s']} s; layer change -> all head maps "
            f"{b['layer_change_to_all_heads_s']} s"
        )
    if e := r.get("export"):
        print(
            f"Export of 32 images: {e['batch1_img_per_s']} img/s one at a time, {e['batch8_img_per_s']} img/s in "
            f"batches of 8 ({e['batched_vs_single']}x)"
        )
    if c := r.get("causal"):
        h, f = c["head_importance_cost"], c["fast_vs_exact"]
        print(
            f"Head importance, ViT-B/16 (144 heads): exact {h['exact_forward_equivalents']} forward-equivalents, "
            f"fast estimate {h['fast_forward_equivalents']}; fast vs exact Spearman over {f['images']} demo images: "
            f"mean {f['spearman_mean']}, median {f['spearman_median']}"
        )
    if o := r.get("causal", {}).get("one_run"):
        print(
            f"Heads + Rollout + Relevance + lens + attribution + fast estimate of one image: "
            f"{o['forwards_shared']} forward with one Run (was {o['forwards_separate']}), "
            f"{o['shared_s']} s vs {o['separate_s']} s ({o['shared_over_separate']}x)"
        )
    if f := r.get("faithfulness"):
        print(
            f"Deletion + insertion of one ViT-B/16 image: {f['curves_over_forward']}x one forward "
            f"({f['forwards']} images forwarded in batches of {f['batch_size']})"
        )
    if ev := r.get("evaluate"):
        print(
            f"evaluate, demo model, {ev['images']} images, {', '.join(ev['methods'])}: local "
            f"{ev['local']['steady_images_per_s']} img/s, Ray ({ev['ray_cpus']} CPUs) "
            f"{ev['ray']['steady_images_per_s']} img/s = {ev['ray_over_local']}x"
        )
    if lrp := r.get("attnlrp"):
        print(
            f"AttnLRP, ViT-B/16 at 224: {lrp['forward_equivalents']} forward-equivalents "
            f"({lrp['attnlrp_s']} s against a {lrp['forward_s']} s forward)"
        )
    if hv := r.get("headview"):
        print(
            f"Instant head view, {hv['model']} in Chromium: input -> redraw median {hv['redraw_ms_median']} ms, "
            f"p95 {hv['redraw_ms_p95']} ms; 16 pages at once p95 {hv['sessions16_redraw_ms_p95']} ms; "
            f"page {hv['payload_MB']} MB (packed in {hv['pack_s']} s); vitviz.show first draw "
            f"{hv['show_first_draw_s']} s = {hv['show_over_app']}x the app's upload -> map ({hv['app_upload_to_map_s']} s)"
            + (
                f", {hv['show_over_app_browser']}x the app's upload -> maps in Chromium "
                f"({hv['app_browser_upload_to_maps_s']} s)"
                if "show_over_app_browser" in hv
                else ""
            )
        )
    if co := r.get("compare_open"):
        from benchmarks.compare_open import print_row

        print_row(co)
    if hy := r.get("hybrid"):
        from benchmarks.hybrid import print_row as print_hybrid

        print_hybrid(hy)
    if im := r.get("imports"):
        from benchmarks.imports import print_rows

        print_rows(im)
    print(f"Peak resident memory of the benchmark process: {r['peak_rss_MiB']} MiB")


if __name__ == "__main__":
    sys.exit(main())
