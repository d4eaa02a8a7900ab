"""Issue 23 in the app (AppTest): settings errors, last-resort errors, uploads a visitor can abuse.

Each test reproduces one finding of the attack pass; the words checked are the visitor's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def _reset_server_caches() -> None:
    from pages import common

    for fn in (common.serve_settings, common.model_cache, common.forward_queue, common.vetted_requests):
        fn.clear()
    common.hub_downloads.clear()


@pytest.fixture()
def server(monkeypatch, tmp_path):
    """A fresh server (its cached settings dropped) in public mode, generous limits."""
    monkeypatch.setenv("VITVIZ_PUBLIC", "1")
    monkeypatch.delenv("VITVIZ_CONFIG", raising=False)
    _reset_server_caches()
    yield
    _reset_server_caches()


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
    from pages import common

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
