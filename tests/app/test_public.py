"""Public mode in the app (AppTest): what a visitor can and cannot make the server do, and the exact words."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image
from streamlit.testing.v1 import AppTest

from vitviz.serve import policy

APP = str(Path(__file__).resolve().parents[2] / "app.py")
OTHER = "other (Hugging Face model id)…"


def _reset_server_caches() -> None:
    from ui import common

    for fn in (
        common.serve_settings,
        common.model_cache,
        common.forward_queue,
        common.vetted_requests,
        common.hub_downloads,
    ):
        fn.clear()


@pytest.fixture()
def public(monkeypatch, tmp_path):
    monkeypatch.setenv("VITVIZ_PUBLIC", "1")
    monkeypatch.setenv("VITVIZ_UPLOADS_PER_MINUTE", "2")
    monkeypatch.setenv("VITVIZ_MODEL_CHANGES_PER_MINUTE", "3")
    monkeypatch.chdir(tmp_path)  # no vitviz.toml here
    from ui import common

    monkeypatch.setattr(common, "hub_online", lambda: True)  # typed ids are offered only with the hub in reach
    _reset_server_caches()
    yield
    _reset_server_caches()


def _app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    return at


def _type(at: AppTest, text: str) -> None:
    at.selectbox(key="model_pick").set_value(OTHER).run()
    at.text_input(key="model_text").input(text).run()


def _errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def test_typed_paths_get_one_message_that_reveals_nothing(public, tiny_dirs, tmp_path):
    (tmp_path / "a-file.txt").write_text("x")
    seen = set()
    for text in (str(tiny_dirs["vit"]), str(tmp_path / "a-file.txt"), str(tmp_path / "nothing-here"), "../..", "~"):
        at = _app()
        _type(at, text)
        assert not at.exception
        assert at.session_state.model_name == "demo"  # nothing was loaded
        seen.add(tuple(_errors(at)))
    assert seen == {(policy.PATH_REFUSED,)}


def test_hub_ids_outside_the_allowlist_are_refused_before_any_download(public, monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the hub must not be contacted")

    monkeypatch.setattr(policy.Hub, "default", classmethod(lambda cls: no_network()))
    at = _app()
    _type(at, "someone/giant-dinov2")
    assert _errors(at) == [policy.HUB_ID_REFUSED.format(name="someone/giant-dinov2")]
    assert at.session_state.model_name == "demo" and not at.exception


def test_the_list_offers_the_allowlist_and_a_bundled_model_loads(public):
    at = _app()
    options = at.selectbox(key="model_pick").options
    assert options[0] == "demo" and OTHER in options and "google/vit-base-patch16-224" in options
    if "demo-swin" in options:
        at.selectbox(key="model_pick").set_value("demo-swin").run()
        assert at.session_state.model_name == "demo-swin" and not at.exception and not at.error


def _png(colour) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), colour).save(buf, format="PNG")
    return buf.getvalue()


def test_uploads_are_rate_limited_politely(public):
    at = _app()
    for i, colour in enumerate([(200, 0, 0), (0, 200, 0)]):
        at.file_uploader[0].set_value((f"img{i}.png", _png(colour), "image/png")).run()
        assert at.session_state.image_name == f"img{i}.png" and not at.error
    at.file_uploader[0].set_value(("img2.png", _png((0, 0, 200)), "image/png")).run()
    assert not at.exception
    assert at.session_state.image_name == "img1.png"  # the current image stays
    assert any("You have uploaded 2 images in the last minute" in e and "try again in" in e for e in _errors(at))


def test_model_changes_are_rate_limited_politely(public):
    at = _app()
    for k in range(3):
        _type(at, f"not/allowed-{k}")  # each new choice counts, refused or not (reruns showing it do not)
    _type(at, "another/attempt")
    assert any("try again in" in e for e in _errors(at))
    assert not at.exception


def test_local_mode_is_unchanged(monkeypatch, tmp_path, tiny_dirs):
    monkeypatch.delenv("VITVIZ_PUBLIC", raising=False)
    monkeypatch.chdir(tmp_path)
    _reset_server_caches()
    try:
        at = AppTest.from_file(APP, default_timeout=120)
        at.run()
        at.selectbox(key="model_pick").set_value("other (hub id or local folder)…").run()
        at.text_input(key="model_text").input(str(tiny_dirs["vit"])).run()
        assert at.session_state.model_name == str(tiny_dirs["vit"]) and not at.error and not at.exception
    finally:
        _reset_server_caches()
