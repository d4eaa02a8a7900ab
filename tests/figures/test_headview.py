"""The instant head view: packing against numpy, the page driven in Chromium (decoding, clicks, redraw)."""

from __future__ import annotations

import numpy as np
import pytest
from browser_tools import CHROMIUM, FLAGS, require_chromium

from vitviz.figures.headview import (
    DEFAULT_MAX_BYTES,
    HeadViewTooLarge,
    head_view_data,
    head_view_html,
    head_view_problem,
    pack_rows,
    unpack_rows,
)


def _attention(L: int, H: int, T: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=3.0, size=(L, H, T, T)).astype(np.float32)
    a = np.exp(logits - logits.max(-1, keepdims=True))
    return a / a.sum(-1, keepdims=True)


def test_pack_rows_reads_back_within_half_a_step_of_the_row_maximum():
    rows = np.abs(np.random.default_rng(1).normal(size=(5, 7, 40))).astype(np.float32)
    rows[0, 0] = 0.0  # an all-zero row stays zero
    codes, top = pack_rows(rows)
    assert codes.dtype == np.uint8 and top.shape == (5, 7)
    back = unpack_rows(codes, top)
    assert np.all(np.abs(back - rows) <= top[..., None] / 510 + 1e-7)
    assert np.all(back[0, 0] == 0) and top[0, 0] == 0
    assert np.all(codes.max(-1)[top > 0] == 255)  # the maximum is code 255


def test_problem_messages_for_records_without_one_grid():
    assert "plain ViT" in head_view_problem(None, (2, 2), 1)
    assert head_view_problem(np.zeros((1, 1, 5, 5)), (2, 2), 1) == ""
    assert "padding" in head_view_problem(np.zeros((1, 1, 7, 7)), (2, 2), 1)
    with pytest.raises(ValueError, match="plain ViT"):
        head_view_data(None, grid=(2, 2), prefix_kinds=("CLS",), image=np.zeros((8, 8, 3), np.uint8))


def test_vit_b16_payload_fits_the_budget_and_a_larger_one_is_refused():
    att = _attention(12, 12, 197, seed=2).astype(np.float16)
    data = head_view_data(att, grid=(14, 14), prefix_kinds=("CLS",), image=np.zeros((224, 224, 3), np.uint8))
    assert data.nbytes <= DEFAULT_MAX_BYTES
    with pytest.raises(HeadViewTooLarge, match="MB"):
        head_view_data(att, grid=(14, 14), prefix_kinds=("CLS",), image=np.zeros((8, 8, 3), np.uint8), max_bytes=10**6)


def test_lut_starts_at_infernos_own_bottom_colour():
    data = head_view_data(_attention(1, 1, 5), grid=(2, 2), prefix_kinds=("CLS",), image=np.zeros((8, 8, 3), np.uint8))
    assert data.lut[0] == "#000004" and len(data.lut) == 256


@pytest.fixture(scope="module")
def page():
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser.new_page(viewport={"width": 1366, "height": 768})
        finally:
            browser.close()


def _load(page, att, grid, prefix, image):
    data = head_view_data(att, grid=grid, prefix_kinds=prefix, image=image, title="test <b>x</b>")
    page.set_content(head_view_html(data))
    page.wait_for_function("document.body.dataset.ready !== undefined", timeout=20_000)
    assert page.evaluate("document.body.dataset.ready") == "1", page.inner_text("#err")
    return data


def test_page_decodes_the_maps_that_numpy_packed(page):
    att = _attention(3, 4, 2 + 12, seed=3)  # CLS, DIST and a 3 x 4 grid
    _load(page, att, (3, 4), ("CLS", "DIST"), np.full((30, 40, 3), 200, np.uint8))
    codes, top = pack_rows(att[..., 2:])
    expected = unpack_rows(codes, top)
    for layer, h, q in [(0, 0, 0), (2, 3, 1), (1, 2, 9)]:
        got = page.evaluate(f"[...Array(12).keys()].map(n => window.vitvizValue({layer}, {h}, {q}, n))")
        assert np.allclose(got, expected[layer, h, q], atol=1e-6)
    assert "test <b>x</b>" in page.inner_text("body")  # the title is text, not markup


def test_sliders_and_a_click_redraw_the_right_map_in_the_browser(page):
    att = _attention(3, 4, 1 + 12, seed=4)
    data = _load(page, att, (3, 4), ("CLS",), np.zeros((30, 40, 3), np.uint8))
    page.fill("#layer", "1")  # fires input: layer 1
    page.locator("#head").fill("2")
    box = page.locator("#big").bounding_box()
    # click the cell of row 2, column 1 (a 3 x 4 grid over the canvas)
    page.mouse.click(box["x"] + box["width"] * 1.5 / 4, box["y"] + box["height"] * 2.5 / 3)
    state = page.evaluate("window.vitvizState")
    assert (state["layer"], state["head"], state["query"]) == (1, 2, 1 + 2 * 4 + 1)
    codes, _ = pack_rows(att[..., 1:])
    lut = [tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in data.lut]
    pixels = np.array(page.evaluate("window.vitvizBigPixels()")).reshape(12, 4)[:, :3]
    expected = np.array([lut[c] for c in codes[1, 2, 1 + 2 * 4 + 1]])
    assert np.array_equal(pixels, expected)
    # the thumbnails show the new query too: thumbnail (0, 0) holds map (0, 0, query)
    timings = page.evaluate("window.vitvizTimings")
    assert len(timings) >= 3


def test_shared_scale_lowers_weaker_heads_codes(page):
    att = _attention(1, 2, 1 + 4, seed=5)
    att[0, 1] *= 0.5  # head 1 at half strength: under the layer's shared scale its codes halve
    data = _load(page, att, (2, 2), ("CLS",), np.zeros((8, 8, 3), np.uint8))
    page.select_option("#scale", "layer")
    page.evaluate("window.vitvizSet({head: 1, query: 0})")
    lut = [tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in data.lut]
    codes, top = pack_rows(att[..., 1:])
    shared = np.rint(codes[0, 1, 0] * top[0, 1, 0] / top[0, :, 0].max()).astype(int)
    pixels = np.array(page.evaluate("window.vitvizBigPixels()")).reshape(4, 4)[:, :3]
    assert np.array_equal(pixels, np.array([lut[c] for c in shared]))


def test_a_record_whose_last_block_is_a_pooling_head_is_drawn_on_the_server():
    from types import SimpleNamespace

    from vitviz.figures.headview import record_problem

    cap = SimpleNamespace(
        attention_stack=np.zeros((2, 1, 5, 5)),
        num_blocks=3,  # two attention blocks in the stack, then the pooling head outside it
        model_name="cct",
        grid=(2, 2),
        num_prefix_tokens=1,
        block_label=lambda b: "pooling head" if b == 2 else f"layer {b}",
    )
    assert "pooling head" in record_problem(cap)
    cap.num_blocks = 2
    assert record_problem(cap) == ""


# Issue 33.4: a model folder named like this ran script in the page (the title was escaped, then the data's JSON
# replaced ``__DATA__`` everywhere, inside the title too). Every field the page shows gets a hostile name.
HOSTILE = [
    "m__DATA__<img src=x onerror=window.__pwned=1>",
    "</script><script>window.__pwned=2</script>",
    "__START__<svg onload=window.__pwned=3>",
    "a&amp;b<!--",
    "\u2028\u2029 quote\" ' `",
]


def _hostile_data():
    att = _attention(2, 2, 1 + 4, seed=6)
    return head_view_data(
        att,
        grid=(2, 2),
        prefix_kinds=(HOSTILE[1],),
        image=np.zeros((8, 8, 3), np.uint8),
        title=HOSTILE[0],
        layer_names=HOSTILE[2:4],
    )


def test_hostile_names_never_reach_the_page_as_markup():
    page = head_view_html(_hostile_data())
    for name in HOSTILE:
        for part in ("<img", "<script>window", "<svg", "<!--"):
            if part in name:
                assert name not in page  # never verbatim: only as JSON with <, > and & escaped
    assert page.count("<script") == 2  # the data's JSON element and the page's own script, nothing else
    start = page.index('<script id="vitviz-data" type="application/json">')
    body = page[start:].split(">", 1)[1].split("</script>", 1)[0]
    assert "<" not in body and ">" not in body and "&" not in body
    data = __import__("json").loads(body)
    assert data["title"] == HOSTILE[0] and data["prefix"] == [HOSTILE[1]] and data["layer_names"] == HOSTILE[2:4]
    outside = page.replace(body, "")
    assert "__" not in outside  # the one placeholder was filled once; no text of the data outside its element


def test_hostile_names_run_no_script_in_a_browser_and_show_as_text(page):
    page.set_content(head_view_html(_hostile_data()))
    page.wait_for_function("document.body.dataset.ready !== undefined", timeout=20_000)
    assert page.evaluate("document.body.dataset.ready") == "1", page.inner_text("#err")
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate("document.querySelectorAll('img, svg').length") == 0
    text = page.inner_text("body")
    assert HOSTILE[0] in text  # the title, as text
    assert page.evaluate("document.getElementById('layerv').textContent") == HOSTILE[3]  # the last layer's name
    page.evaluate("window.vitvizSet({layer: 0, query: 0})")
    assert page.evaluate("document.getElementById('layerv').textContent") == HOSTILE[2]
    assert HOSTILE[1] in page.inner_text("#prefix")  # the prefix token's name
    assert page.evaluate("typeof window.__pwned") == "undefined"
