"""Issue 23 in the app (AppTest): settings errors, last-resort errors, uploads a visitor can abuse.

Each test reproduces one finding of the attack pass; the words checked are the visitor's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from app_tools import charts
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def _reset_server_caches() -> None:
    from ui import common

    for fn in (common.serve_settings, common.model_cache, common.forward_queue, common.vetted_requests):
        fn.clear()
    common.address_limits.clear()
    common.hub_downloads.clear()
    getattr(common.hub_online, "clear", lambda: None)()  # (a test may have replaced it)


@pytest.fixture()
def server(monkeypatch, tmp_path):
    """A fresh server (its cached settings dropped) in public mode, generous limits."""
    monkeypatch.setenv("VITVIZ_PUBLIC", "1")
    monkeypatch.delenv("VITVIZ_CONFIG", raising=False)
    _reset_server_caches()
    yield
    _reset_server_caches()
    from vitviz.data import images

    images.configure(max_pixels=images.MAX_PIXELS, max_side=images.MAX_SIDE, budget_bytes=images.DECODE_BUDGET_BYTES)


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    return at


def _texts(at: AppTest) -> str:
    return " ".join(e.value for e in (*at.error, *at.warning, *at.info, *at.caption, *at.markdown))


def test_a_typo_in_the_settings_file_shows_no_server_path(server, monkeypatch, tmp_path, capfd):
    """Issue 23.15: the visitor saw the absolute path of vitviz.toml; the server log had nothing."""
    secret = tmp_path / "srv" / "private"
    secret.mkdir(parents=True)
    (secret / "vitviz.toml").write_text("[public]\nenabled = true\nmax_downlod_gb = 2\n")
    monkeypatch.setenv("VITVIZ_CONFIG", str(secret / "vitviz.toml"))
    at = _app()
    assert not at.exception
    shown = _texts(at)
    assert "vitviz.toml has unknown setting(s) max_downlod_gb" in shown
    assert str(tmp_path) not in shown
    log = capfd.readouterr().err
    assert f"(settings file: {secret / 'vitviz.toml'})" in log


def test_last_resort_errors_are_logged_in_full_and_shown_without_detail(server, monkeypatch, capfd):
    from ui import common

    def broken():
        raise OSError(2, "No such file or directory", "/srv/vitviz/secret/weights.bin")

    monkeypatch.setattr(common, "require_current", broken)
    at = _app()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert errors == [
        "Something went wrong while drawing this page (FileNotFoundError; the details are in the server's log). "
        "Try another setting; your image and model are kept."
    ]
    log = capfd.readouterr().err
    assert "unexpected error in Image & predictions" in log and "Traceback" in log
    assert "/srv/vitviz/secret/weights.bin" in log


def test_start_up_log_names_the_settings_and_public_mode(server, capfd):
    at = _app()
    assert not at.exception
    log = capfd.readouterr().err
    assert "vitviz public mode:" in log and "(settings from environment VITVIZ_PUBLIC)" in log


def _results_bytes(rows: int = 2, long_path: int = 0) -> bytes:
    """A results file of ``rows`` rows (one image, ``rows`` methods); ``long_path``: every row's path that long."""
    import io
    from types import SimpleNamespace

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from vitviz.evaluate.results import META_KEY, SCHEMA, make_rows, rows_to_table, run_metadata

    f = SimpleNamespace(
        class_index=1,
        label="one",
        probability=0.5,
        deletion_area=0.2,
        insertion_area=0.6,
        peak_in_box=None,
        fractions=np.linspace(0, 1, 21),
        deletion=np.zeros(21),
        insertion=np.ones(21),
    )
    base = make_rows(
        image_id="a.png",
        path="a.png",
        label=None,
        image_wh=(10, 10),
        box=None,
        scored={"attention": f},
        model="demo",
        input_hw=(48, 48),
        seed=0,
        seed_of_image=1,
        head_distance=np.ones((2, 2)),
        head_entropy=np.ones((2, 2)),
    )
    table = rows_to_table(base).take(pa.array(np.zeros(rows, dtype=np.int64))) if rows else SCHEMA.empty_table()
    if long_path:
        path = pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, dtype=np.int32)), pa.array(["p" * long_path]))
        table = table.set_column(table.schema.get_field_index("path"), "path", path)
    meta = run_metadata(model="demo", methods=["attention"], seed=0, size=None, data="x", points=21, skipped=[])
    table = table.replace_schema_metadata({META_KEY: __import__("json").dumps(meta).encode()})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def _dataset_page() -> AppTest:
    at = _app()
    at.switch_page("pages/dataset.py")
    return at.run()


def _upload_results(at: AppTest, name: str, data: bytes) -> AppTest:
    at.file_uploader(key="results_upload").set_value((name, data, "application/octet-stream"))
    return at.run()


def test_an_empty_results_file_is_a_message_not_stop_iteration(server):
    """Issue 23.15: an empty results file gave "StopIteration"."""
    at = _upload_results(_dataset_page(), "empty.parquet", _results_bytes(rows=0))
    assert not at.exception and not at.error
    assert any("holds no results" in i.value for i in at.info)


def test_a_results_bomb_is_refused_from_its_footer(server, monkeypatch):
    """Issue 23.1: a few KB of Parquet that decode to 60 MB, against a 20 MB server limit."""
    monkeypatch.setenv("VITVIZ_RESULTS_MAX_MB", "20")
    bomb = _results_bytes(rows=3000, long_path=20_000)
    assert len(bomb) < 50_000
    at = _upload_results(_dataset_page(), "bomb.parquet", bomb)
    assert not at.exception
    assert [e.value for e in at.error] == [
        "the uploaded file would take more than 20 MB of memory once decoded (its column 'path' repeats long "
        "texts); vitviz refuses it. The previous results, if any, are no longer shown."
    ]
    ok = _upload_results(at, "ok.parquet", _results_bytes(rows=3))
    assert not ok.exception and not ok.error and ok.dataframe


def test_results_uploads_are_rate_limited(server, monkeypatch):
    monkeypatch.setenv("VITVIZ_UPLOADS_PER_MINUTE", "2")
    at = _dataset_page()
    for rows in (1, 2):
        at = _upload_results(at, f"r{rows}.parquet", _results_bytes(rows=rows))
        assert not at.error
    at = _upload_results(at, "r3.parquet", _results_bytes(rows=3))
    assert any("You have uploaded 2 results files in the last minute" in e.value for e in at.error)


def test_image_limits_and_the_decode_budget_come_from_the_settings(server, monkeypatch):
    """Issue 23.3 in the app: the server's limits apply to every session's uploads."""
    import io

    from PIL import Image

    from vitviz.data import images

    monkeypatch.setenv("VITVIZ_IMAGE_MAX_SIDE", "100")
    monkeypatch.setenv("VITVIZ_DECODE_BUDGET_MB", "64")
    at = _app()
    assert images.DECODE_BUDGET.total == 64 * 2**20
    buf = io.BytesIO()
    Image.new("RGB", (150, 10)).save(buf, format="PNG")
    at.file_uploader[0].set_value(("thin.png", buf.getvalue(), "image/png")).run()
    assert not at.exception
    assert any("150 x 10 pixels; vitviz accepts sides of at most 100 pixels" in e.value for e in at.error)
    assert at.session_state.image_name != "thin.png"


OTHER = "other (Hugging Face model id)…"


def test_reruns_showing_a_refused_model_do_not_count_as_changes(server, monkeypatch):
    """Issue 23.7: every rerun that still showed a refused (or failed) choice asked again and counted."""
    from ui import common

    monkeypatch.setenv("VITVIZ_MODEL_CHANGES_PER_MINUTE", "3")
    monkeypatch.setattr(common, "hub_online", lambda: True)  # "other" is offered only with the hub in reach
    at = _app()
    at.selectbox(key="model_pick").set_value(OTHER).run()
    at.text_input(key="model_text").input("someone/not-allowed").run()
    first = [e.value for e in at.error]
    assert len(first) == 1 and "try again in" not in first[0]
    for _ in range(4):  # the visitor moves on (other widgets rerun the script); the box still holds the id
        at.run()
        assert [e.value for e in at.error] == first
    assert at.session_state._limits.model_changes.remaining() == 2  # one change was asked for, one counted
    assert at.session_state.model_name == "demo" and not at.exception


def test_hub_offline_public_server_offers_only_what_loads_here(server, monkeypatch, tiny_dirs):
    """Issue 23.7: with the hub offline, hub presets were offered and failed with advice to `hf download`."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VITVIZ_ALLOW", f"google/vit-base-patch16-224,{tiny_dirs['vit']}")
    at = _app()
    options = at.selectbox(key="model_pick").options
    assert options[:3] == ["demo", "demo-swin", "demo-clip"]
    assert str(tiny_dirs["vit"]) in options  # the operator's folder loads without the hub
    assert not any("/" in o and not o.startswith("/") for o in options)  # no hub id (none is cached here)
    assert OTHER not in options  # a typed id could not be downloaded either
    at.selectbox(key="model_pick").set_value(str(tiny_dirs["vit"])).run()
    assert at.session_state.model_name == str(tiny_dirs["vit"]) and not at.error and not at.exception
    assert "hf download" not in _texts(at)


def test_a_hub_preset_asked_for_while_offline_gets_advice_a_visitor_can_follow(server, monkeypatch):
    from ui import common

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(common, "model_options", lambda: ["demo", "google/vit-base-patch16-224"])  # stale list
    at = _app()
    at.selectbox(key="model_pick").set_value("google/vit-base-patch16-224").run()
    errors = [e.value for e in at.error]
    assert errors == [
        "'google/vit-base-patch16-224' is not on this server, and the server cannot reach the Hugging Face hub "
        "just now. Choose another model from the list."
    ]
    assert at.session_state.model_name == "demo" and not at.exception


HOSTILE_LABELS = [
    "[win](http://evil.example)",
    "![px](http://evil.example/p.png)",
    "<a href='http://evil.example'>x</a>",
]


def _rendered_links(at: AppTest) -> list[str]:
    """Links and images in every Markdown element of the page, rendered by CommonMark (markdown-it-py)."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark")
    found = []
    for el in (*at.caption, *at.markdown, *at.error, *at.info, *at.warning):
        html = md.render(el.value)
        found += [html for tag in ("<a ", "<img") if tag in html]
    return found


def _unescaped(markdown: str) -> str:
    """What a Markdown string written by ``md_plain`` shows (escapes and zero-width spaces removed)."""
    import re

    from vitviz.text import ZWSP

    return re.sub(r"\\(.)", r"\1", markdown).replace(ZWSP, "")


def _figure_strings(at: AppTest) -> str:
    import json

    return " ".join(el.proto.spec for el in charts(at)) + " ".join(
        json.dumps(json.loads(el.proto.spec).get("layout", {})) for el in charts(at)
    )


def test_visitor_labels_are_plain_text_and_repeats_one_note(server, monkeypatch):
    """Issue 23.13 (labels shown as Markdown and Plotly markup) and 23.14 (one caption per repeat)."""
    from ui import common

    monkeypatch.setattr(common, "model_options", lambda: ["demo", "demo-clip"])
    at = _app()
    at.selectbox(key="model_pick").set_value("demo-clip").run()
    assert at.session_state.model_name == "demo-clip" and not at.exception
    text = "\n".join(HOSTILE_LABELS + ["cat"] * 2000)
    at.text_area(key="labels_demo-clip").input(text).run()
    assert not at.exception
    assert not _rendered_links(at)
    shown = [_unescaped(c.value) for c in at.caption]
    notes = [c for c in shown if "scored once" in c]
    assert notes == ["Repeated labels are scored once: 'cat' 2,000 times."]
    figures = _figure_strings(at)
    assert "evil.example" in figures  # the labels are shown...
    assert "<a href" not in figures and "<img" not in figures  # ...as text, never as Plotly tags


def test_a_results_file_s_fields_are_plain_text(server):
    import io
    import json

    import pyarrow.parquet as pq

    table = pq.read_table(io.BytesIO(_results_bytes(rows=2)))
    meta = json.loads(table.schema.metadata[b"vitviz"])
    meta.update(model="[m](http://evil.example)", data="![d](http://evil.example/d.png)")
    table = table.replace_schema_metadata({b"vitviz": json.dumps(meta).encode()})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    at = _upload_results(_dataset_page(), "r.parquet", buf.getvalue())
    assert not at.exception and not at.error
    assert any("[m](http://evil.example)" in _unescaped(c.value) for c in at.caption)
    assert not _rendered_links(at)


def test_a_patching_source_upload_counts_once_and_is_decoded_once(server, monkeypatch):
    """Issue 23.3: the Patching page decoded its uploaded source on every rerun, outside the upload limit."""
    import io

    from PIL import Image

    from vitviz.data import images

    decoded = []
    real = images.read_image
    monkeypatch.setattr(images, "read_image", lambda *a, **k: decoded.append(1) or real(*a, **k))  # pages import it
    at = _app()
    at.switch_page("pages/patching.py").run()
    assert not at.exception
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (0, 90, 200)).save(buf, format="PNG")
    at.file_uploader(key="patch_upload").set_value(("[src](http://evil.example).png", buf.getvalue(), "image/png"))
    at.run()
    before, decodes = at.session_state._limits.uploads.remaining(), len(decoded)
    for _ in range(3):
        at.run()
    assert len(decoded) == decodes >= 1  # reruns do not decode the source again
    assert not at.exception and not at.error
    assert at.session_state._limits.uploads.remaining() == before == 9  # one upload counted, once
    assert at.session_state.patch_upload_seen[1] is None
    assert not _rendered_links(at)


def test_a_results_file_with_deeply_nested_metadata_is_not_a_results_file(server):
    """Issue 33.12: "Something went wrong (RecursionError)" on the Data set page."""
    import io

    import pyarrow.parquet as pq

    from vitviz.evaluate.results import META_KEY

    table = pq.read_table(io.BytesIO(_results_bytes(rows=2)))
    deep = table.schema.metadata[META_KEY][:-1] + b', "skipped": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    buf = io.BytesIO()
    pq.write_table(table.replace_schema_metadata({META_KEY: deep}), buf)
    at = _upload_results(_dataset_page(), "deep.parquet", buf.getvalue())
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "not a results header" in errors[0], errors
    assert "Something went wrong" not in errors[0]


# -- issue 33.6: pane B of Side by side counts as the sidebar does ------------------------------------------


def _png_of(colour) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), colour).save(buf, format="PNG")
    return buf.getvalue()


def _side_by_side(differs: str) -> AppTest:
    at = _app()
    at.switch_page("pages/side_by_side.py").run()
    at.radio(key="sbs_differs").set_value(differs).run()
    return at


def test_pane_b_uploads_count_as_uploads(server, monkeypatch):
    """12 pane-B uploads in 31 s were accepted against a limit of 10 per minute."""
    monkeypatch.setenv("VITVIZ_UPLOADS_PER_MINUTE", "3")
    at = _app()
    at.file_uploader[0].set_value(("side.png", _png_of((200, 0, 0)), "image/png")).run()  # the sidebar's: one
    at.switch_page("pages/side_by_side.py").run()
    at.radio(key="sbs_differs").set_value("images").run()
    at.radio(key="sbs_src").set_value("upload").run()
    for i in range(2):
        at.file_uploader(key="sbs_upload").set_value((f"b{i}.png", _png_of((0, 90 * i, 200)), "image/png")).run()
        assert not at.exception and not at.error, [e.value for e in at.error]
        for _ in range(2):  # reruns showing the same file count nothing
            at.run()
    assert at.session_state._limits.uploads.remaining() == 0
    at.file_uploader(key="sbs_upload").set_value(("b9.png", _png_of((9, 9, 9)), "image/png")).run()
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "You have uploaded 3 images in the last minute" in errors[0], errors
    assert errors[0].startswith("Pane B: b9") and not at.exception


def test_pane_b_model_changes_count_as_model_changes(server, monkeypatch):
    """10 pane-B model switches in 28 s gave 20 loads against a limit of 5 changes per minute."""
    monkeypatch.setenv("VITVIZ_MODEL_CHANGES_PER_MINUTE", "2")
    at = _side_by_side("models")
    assert at.selectbox(key="sbs_model").value == "demo-swin" and not at.error  # the first one: one change
    at.selectbox(key="sbs_model").set_value("demo-clip").run()
    assert not at.error and at.session_state._limits.model_changes.remaining() == 0
    for _ in range(2):
        at.run()  # reruns ask nothing
    at.selectbox(key="sbs_model").set_value("demo-swin").run()
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "You have changed the model 2 times in the last minute" in errors[0], errors
    titles = [json.loads(c.proto.spec)["layout"]["title"]["text"] for c in charts(at)]
    assert any(t.startswith("B. demo-clip") for t in titles), titles  # pane B keeps the model it had
    assert at.session_state.model_name == "demo" and not at.exception


# -- issue 33.15: a new session from the same address gets no new uploads ---------------------------------------


def test_uploads_count_per_client_address_across_sessions(server, monkeypatch):
    """The 11th upload was refused, but a fresh session (a reload) uploaded at once."""
    from ui import common

    common.address_limits.clear()
    monkeypatch.setenv("VITVIZ_UPLOADS_PER_MINUTE", "2")
    monkeypatch.setattr(common, "client_address", lambda: "203.0.113.7")
    at = _app()
    for i in range(2):
        at.file_uploader[0].set_value((f"u{i}.png", _png_of((80 * i, 0, 0)), "image/png")).run()
        assert not at.error, [e.value for e in at.error]
    fresh = _app()  # a reload: a new session from the same address
    fresh.file_uploader[0].set_value(("again.png", _png_of((0, 0, 0)), "image/png")).run()
    errors = [e.value for e in fresh.error]
    assert len(errors) == 1 and "You have uploaded 2 images in the last minute" in errors[0], errors
    assert fresh.session_state.image_name != "again.png"
    monkeypatch.setattr(common, "client_address", lambda: "198.51.100.1")  # another visitor
    other = _app()
    other.file_uploader[0].set_value(("mine.png", _png_of((0, 99, 0)), "image/png")).run()
    assert not other.error and other.session_state.image_name == "mine.png"
    monkeypatch.setenv("VITVIZ_PER_ADDRESS", "0")  # behind a reverse proxy: the operator turns it off
    _reset_server_caches()
    monkeypatch.setattr(common, "client_address", lambda: "203.0.113.7")
    off = _app()
    off.file_uploader[0].set_value(("proxy.png", _png_of((1, 2, 3)), "image/png")).run()
    assert not off.error and off.session_state.image_name == "proxy.png"
    common.address_limits.clear()
