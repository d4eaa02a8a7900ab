"""The views of ui/model_views.py are functions of their state: drawn twice with two pane states, each shows
its own model's and image's numbers, checked against references computed outside the app."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from app_tools import no_trouble
from PIL import Image
from streamlit.testing.v1 import AppTest
from target_reference import relevance_by_hand
from test_page_views import _array, _charts, _tiles

from vitviz.capture.forward import preprocess
from vitviz.models.load import load_model

ROOT = str(Path(__file__).resolve().parents[2])
EXAMPLES = Path(ROOT) / "assets" / "examples"
LABELS = ("circle", "star", "square")

pytestmark = pytest.mark.usefixtures("one_thread")


def _twice_script(root: str, states: tuple, positions: tuple, targets: tuple) -> None:
    """Every view of ui/model_views.py drawn once per pane state; nothing in the session first."""
    import sys

    if root not in sys.path:
        sys.path.insert(0, root)
    import streamlit as st

    from ui import common, model_views
    from vitviz.capture.targets import Target

    drawn = {}
    for who, state, position, (index, minus, start) in zip("AB", states, positions, targets, strict=True):
        cur = common.current_of(state)
        at = model_views.PositionSettings(0, position)
        model_views.draw_position_grid(cur, at, key=f"{who}_position")
        tile = model_views.draw_position_tile(cur, at, key=f"{who}_position")
        model_views.draw_components(cur, key=f"{who}_components")
        model_views.draw_token_norms(cur, model_views.NormsSettings(0), key=f"{who}_norms")
        ranked = model_views.draw_predictions(cur, key=f"{who}_predictions")
        target = Target.of_label(ranked.labels, index, minus) if ranked.labels else Target.of_class(index, minus)
        settings = model_views.TargetRelevanceSettings(target, start_block=start)
        rel = model_views.draw_target_relevance(cur, settings, key=f"{who}_relevance")
        drawn[who] = tile, rel
    st.session_state.drawn = drawn


def _cosine(table: np.ndarray) -> np.ndarray:
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    return unit @ unit.T


def test_model_views_drawn_twice_with_two_states_show_each_states_own_numbers():
    from ui.common import PaneState, digest

    star, circle = ((EXAMPLES / n).read_bytes() for n in ("demo-star.png", "demo-circle.png"))
    states = (
        PaneState("demo", star, digest(star)),
        PaneState("demo-clip", circle, digest(circle), labels_text=", ".join(LABELS), template="a photo of a {}."),
    )
    positions = (13, 50)
    targets = ((3, 1, 1), (0, 2, 0))  # (class or label, minus, start block)
    at = AppTest.from_function(_twice_script, args=(ROOT, states, positions, targets), default_timeout=240)
    at.run()
    no_trouble(at)
    charts = _charts(at)
    keys = {f"{w}_{k}" for w in "AB" for k in ("position_grid", "position_tile", "components", "norms")}
    keys |= {f"{w}_{k}" for w in "AB" for k in ("predictions", "relevance")}
    assert keys <= set(charts)  # no chart replaced another
    assert {b.key for b in at.get("download_button")} >= {f"{w}_{k}-npz" for w in "AB" for k in ("norms", "relevance")}

    refs = {}
    for who, name, image_name, position, (index, minus, start) in zip(
        "AB", ("demo", "demo-clip"), ("demo-star.png", "demo-circle.png"), positions, targets, strict=True
    ):
        loaded = load_model(name, device="cpu")
        params = dict(loaded.model.named_parameters())
        image = Image.open(EXAMPLES / image_name).convert("RGB")
        pixels = preprocess(loaded, [image], (96, 96))[0]

        # positions: cosine of the raw position-embedding parameter's patch rows (CLS row dropped)
        raw = next(p for k, p in params.items() if "position_embedding" in k and "text" not in k)
        sim = _cosine(raw.detach().double().numpy().reshape(145, 96)[1:])
        grid = _tiles(charts[f"{who}_position_grid"][1], 144, (12, 12), cols=12)
        assert np.allclose(grid, sim.reshape(144, 12, 12), atol=1e-5)
        tile = charts[f"{who}_position_tile"]
        r, c = divmod(position, 12)
        assert tile[0] == f"Similarity to position ({r}, {c})"
        assert np.allclose(tile[1], sim[position].reshape(12, 12), atol=1e-5)

        # patch-embedding components: variance explained, from the eigenvalues of the filters' covariance
        conv = next(p for p in params.values() if p.ndim == 4).detach().double().numpy()
        flat = conv.reshape(len(conv), -1)
        flat = flat - flat.mean(axis=0)
        eig = np.sort(np.linalg.eigvalsh(flat.T @ flat))[::-1]
        shown = _array(charts[f"{who}_components"][2][1]["customdata"])[:, 1]
        assert np.allclose(shown, 100 * eig[:28] / eig.sum(), rtol=1e-6, atol=1e-9)

        # token norms: the model's own hidden states
        tower = loaded.model.vision_model if loaded.zero_shot else loaded.model
        with torch.no_grad():
            hidden = tower(pixel_values=pixels, output_hidden_states=True).hidden_states
        norms = torch.stack(hidden)[:, 0].double().norm(dim=-1).numpy()
        assert np.allclose(charts[f"{who}_norms"][1], norms, rtol=1e-5)

        # predictions and relevance: the model's own forward, relevance by hand
        if loaded.zero_shot:
            tok = loaded.text.tokenizer([f"a photo of a {n}." for n in LABELS], padding=True, return_tensors="pt")
            with torch.enable_grad():
                p = pixels.clone().requires_grad_(True)
                out = loaded.model(**tok, pixel_values=p, output_attentions=True)
                logits = out.logits_per_image[0]
                att = out.vision_model_output.attentions
                grads = torch.autograd.grad(logits[index] - logits[minus], att)
            rel = np.eye(att[0].shape[-1])
            for x, g in list(zip(att, grads, strict=True))[start:]:
                rel = rel + (g * x).clamp(min=0).mean(dim=1)[0].detach().double().numpy() @ rel
            rel = rel[0, 1:].reshape(12, 12)
            names = [f"{n} ({i})" for i, n in enumerate(LABELS)]
            title = f"Relevance for label '{LABELS[index]}' minus label '{LABELS[minus]}'"
        else:
            with torch.no_grad():
                logits = loaded.model(pixel_values=pixels).logits[0]
            rel = relevance_by_hand(loaded.model, pixels, index, minus, (12, 12), start=start)
            names = [f"{loaded.id2label[i]} ({i})" for i in range(len(logits))]
            title = f"Relevance for {loaded.id2label[index]} ({index}) minus {loaded.id2label[minus]} ({minus})"
        probs = torch.softmax(logits.detach().double(), 0).numpy()
        top = np.argsort(-probs)[:5][::-1]  # drawn most probable on top
        bars = charts[f"{who}_predictions"][2][0]
        assert list(bars["y"]) == [names[i] for i in top]
        assert np.allclose(_array(bars["x"]), probs[top], atol=1e-5)
        drawn = charts[f"{who}_relevance"]
        assert drawn[0].startswith(title), drawn[0]
        assert np.allclose(drawn[1], rel, rtol=1e-4, atol=1e-6)
        refs[who] = (sim, norms, rel, _array(bars["x"]), shown)
        returned_tile, returned_rel = at.session_state.drawn[who]
        assert np.allclose(returned_tile, sim[position].reshape(12, 12), atol=1e-5)
        assert np.allclose(returned_rel, rel, rtol=1e-4, atol=1e-6)
    for a, b in zip(refs["A"], refs["B"], strict=True):
        assert a.shape != b.shape or not np.allclose(a, b, rtol=1e-3, atol=1e-6)  # neither state reused the other
    words = [m.value for m in at.markdown if "<span" in m.value]
    assert len(words) == 2  # the zero-shot pane's two labels' prompt words; the classifier has none


def _bias_script(root: str, states: tuple, block: int) -> None:
    import sys

    if root not in sys.path:
        sys.path.insert(0, root)
    from ui import common, model_views

    for who, state in zip("AB", states, strict=True):
        model_views.draw_bias(common.current_of(state), model_views.BiasSettings(block), key=f"{who}_bias")


def test_bias_view_drawn_twice_shows_each_models_own_table(hier_dirs):
    from ui.common import PaneState, digest

    star = (EXAMPLES / "demo-star.png").read_bytes()
    names = ("demo-swin", str(hier_dirs["swin"]))
    states = tuple(PaneState(n, star, digest(star)) for n in names)
    at = AppTest.from_function(_bias_script, args=(ROOT, states, 0), default_timeout=180)
    at.run()
    no_trouble(at)
    charts = _charts(at)
    tables = []
    for who, name in zip("AB", names, strict=True):
        loaded = load_model(name, device="cpu")
        raw = next(p for k, p in loaded.model.named_parameters() if k.endswith("relative_position_bias_table"))
        side = math.isqrt(raw.shape[0])  # (2w - 1)^2 offsets, one column per head
        # HF's table row (qy - ky + w - 1) * (2w - 1) + (qx - kx + w - 1); the view's cell [h, dy + w - 1, dx + w - 1]
        # is a key dy rows below and dx columns right of the query: the table's offsets negated
        want = raw.detach().double().numpy().T.reshape(-1, side, side)[:, ::-1, ::-1]
        got = _tiles(charts[f"{who}_bias_grid"][1], len(want), (side, side))
        assert np.allclose(got, want, rtol=1e-6, atol=1e-7)
        tables.append(want)
    assert tables[0].shape != tables[1].shape or not np.allclose(*tables, atol=1e-6)


def _reads_script(root: str, states: tuple) -> None:
    import sys

    if root not in sys.path:
        sys.path.insert(0, root)
    from ui import common, model_views

    for who, state in zip("AB", states, strict=True):
        cur = common.current_of(state)
        model_views.draw_model_summary(cur)
        model_views.draw_patch_grid(cur, key=f"{who}_patch_grid")
        model_views.draw_token_sequence(cur, key=f"{who}_sequence")


def _picture(source: str) -> np.ndarray:
    """The pixels of a figure's ``go.Image`` data URI."""
    import base64
    import io

    return np.asarray(Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1]))).convert("RGB"), np.float64)


def test_how_the_model_reads_the_image_drawn_twice_shows_each_models_own_grid():
    from ui.common import PaneState, digest

    star, circle = ((EXAMPLES / n).read_bytes() for n in ("demo-star.png", "demo-circle.png"))
    states = (PaneState("demo", star, digest(star)), PaneState("demo-swin", circle, digest(circle)))
    at = AppTest.from_function(_reads_script, args=(ROOT, states), default_timeout=180)
    at.run()
    no_trouble(at)
    charts = _charts(at)
    captions = [c.value for c in at.caption]
    pictures = []
    for who, name, image_name in zip("AB", ("demo", "demo-swin"), ("demo-star.png", "demo-circle.png"), strict=True):
        loaded = load_model(name, device="cpu")
        cfg = loaded.model.config
        patch = cfg.patch_size
        side = cfg.image_size // patch  # 96 px: 12 x 12 patches of 8 px (ViT), 24 x 24 of 4 px (Swin)
        prefix = 0 if loaded.family.hierarchical else 1  # Swin has no CLS token
        _, resized = preprocess(loaded, [Image.open(EXAMPLES / image_name).convert("RGB")], (96, 96))
        title, _, traces = charts[f"{who}_patch_grid"]
        want = f"{side} x {side} patches (rows x columns) of {patch} px; input 96 x 96 px (width x height)"
        assert title.replace("<br>", " ") == want  # the title wraps to the figure's width
        shown = _picture(next(t for t in traces if t["type"] == "image")["source"])
        pictures.append((shown, resized[0].astype(np.float64)))
        title, _, _ = charts[f"{who}_sequence"]
        assert (
            title == f"Input sequence: {prefix} prefix token(s) + {side * side} patches = {prefix + side * side} tokens"
        )
        if loaded.family.hierarchical:
            summary = next(c for c in captions if c.startswith(f"**{name}**"))
            stages = [
                f"stage {i}: {side >> i} x {side >> i} tokens (rows x columns), {d} blocks of {h} heads"
                for i, (d, h) in enumerate(zip(cfg.depths, cfg.num_heads, strict=True))
            ]
            assert all(s in summary for s in stages), summary
        else:
            want = (
                f"**{name}** (ViT): {cfg.num_hidden_layers} blocks x {cfg.num_attention_heads} heads, input 96 x 96 px"
            )
            assert any(c.startswith(want) for c in captions), captions
    for (shown, own), (_, other) in zip(pictures, pictures[::-1], strict=True):
        # each pane's own resized image (JPEG-compressed on the way), not the other pane's
        assert np.abs(shown - own).mean() < 10 < np.abs(shown - other).mean()
