"""Serving settings: defaults per mode, the TOML file, environment overrides, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitviz.serve import settings as settings_mod
from vitviz.serve.settings import DEMOS, ServeSettings, SettingsError, load_settings

ROOT = Path(__file__).resolve().parents[2]

FULL = """
[public]
enabled = true
allow = ["demo", "demo-swin", "google/vit-base-patch16-224"]
allow_hub_ids = true
max_download_gb = 0.5
model_memory_gib = 2.0
forward_slots = 3
uploads_per_minute = 4
model_changes_per_minute = 2
hub_downloads_per_hour = 7
hub_timeout_s = 3.5
"""


@pytest.fixture(autouse=True)
def _cpu(monkeypatch):
    monkeypatch.setattr(settings_mod, "_cuda_available", lambda: False)


def write(folder: Path, text: str, name: str = "vitviz.toml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_local_defaults_change_nothing():
    s = ServeSettings()
    assert not s.public
    assert (s.forward_slots, s.uploads_per_minute, s.model_changes_per_minute, s.hub_downloads_per_hour) == (0, 0, 0, 0)
    assert s.model_memory_gib == 4.0 and s.model_memory_bytes == 4 * 2**30
    assert s.allow == () and not s.allow_hub_ids


def test_public_defaults():
    s = ServeSettings(public=True)
    assert (s.forward_slots, s.uploads_per_minute, s.model_changes_per_minute, s.hub_downloads_per_hour) == (
        1,
        10,
        5,
        20,
    )
    assert s.max_download_gb == 1.0 and s.max_download_bytes == 10**9
    assert s.model_memory_gib == 4.0 and not s.allow_hub_ids and s.hub_timeout_s == 10.0


def test_public_default_slots_on_a_gpu(monkeypatch):
    monkeypatch.setattr(settings_mod, "_cuda_available", lambda: True)
    assert ServeSettings(public=True).forward_slots == 2
    assert ServeSettings(public=False).forward_slots == 0
    assert ServeSettings(public=True, forward_slots=1).forward_slots == 1


def test_demos_are_the_bundled_models():
    assert DEMOS == ("demo", "demo-swin", "demo-clip")


def test_no_file_no_environment_is_local(tmp_path):
    s = load_settings({}, folder=tmp_path)
    assert s == ServeSettings() and s.origin == "defaults"


def test_environment_switch(tmp_path):
    for on in ("1", "true", "YES", " on "):
        assert load_settings({"VITVIZ_PUBLIC": on}, folder=tmp_path).public
    for off in ("0", "false", "no", "OFF", ""):
        assert not load_settings({"VITVIZ_PUBLIC": off}, folder=tmp_path).public


def test_file_beside_the_app(tmp_path):
    write(tmp_path, FULL)
    s = load_settings({}, folder=tmp_path)
    assert s.public and s.allow_hub_ids
    assert s.allow == ("demo", "demo-swin", "google/vit-base-patch16-224")
    assert (s.max_download_gb, s.model_memory_gib, s.hub_timeout_s) == (0.5, 2.0, 3.5)
    assert (s.forward_slots, s.uploads_per_minute, s.model_changes_per_minute, s.hub_downloads_per_hour) == (3, 4, 2, 7)
    assert s.origin == str(tmp_path / "vitviz.toml")


def test_file_from_vitviz_config(tmp_path):
    path = write(tmp_path, "[public]\nenabled = true\n", "elsewhere.toml")
    s = load_settings({"VITVIZ_CONFIG": str(path)}, folder=tmp_path / "nowhere")
    assert s.public and s.origin == str(path)


def test_example_file_parses(tmp_path):
    example = ROOT / "vitviz.toml.example"
    s = load_settings({"VITVIZ_CONFIG": str(example)}, folder=tmp_path)
    assert s.public and s.allow == ("google/vit-base-patch16-224",) and not s.allow_hub_ids
    assert s == ServeSettings(public=True, allow=("google/vit-base-patch16-224",))  # the documented defaults


def test_environment_overrides_the_file(tmp_path):
    write(tmp_path, FULL)
    env = {
        "VITVIZ_PUBLIC": "0",
        "VITVIZ_ALLOW": " a/b , c/d,, ",
        "VITVIZ_ALLOW_HUB_IDS": "no",
        "VITVIZ_MAX_DOWNLOAD_GB": "2.5",
        "VITVIZ_MODEL_MEMORY_GIB": "8",
        "VITVIZ_FORWARD_SLOTS": "2",
        "VITVIZ_UPLOADS_PER_MINUTE": "1",
        "VITVIZ_MODEL_CHANGES_PER_MINUTE": "0",
        "VITVIZ_HUB_DOWNLOADS_PER_HOUR": "3",
        "VITVIZ_HUB_TIMEOUT_S": "1",
    }
    s = load_settings(env, folder=tmp_path)
    assert not s.public and not s.allow_hub_ids
    assert s.allow == ("a/b", "c/d")  # replaces the file's list
    assert (s.max_download_gb, s.model_memory_gib, s.hub_timeout_s) == (2.5, 8.0, 1.0)
    assert (s.forward_slots, s.uploads_per_minute, s.model_changes_per_minute, s.hub_downloads_per_hour) == (2, 1, 0, 3)
    assert s.origin.startswith(str(tmp_path / "vitviz.toml") + "; environment VITVIZ_PUBLIC, VITVIZ_ALLOW")


def test_file_without_enabled_stays_local_but_keeps_its_values(tmp_path):
    write(tmp_path, "[public]\nmodel_memory_gib = 1.5\n[other]\nx = 1\n")
    s = load_settings({}, folder=tmp_path)
    assert not s.public and s.model_memory_gib == 1.5
    assert load_settings({"VITVIZ_PUBLIC": "1"}, folder=tmp_path).model_memory_gib == 1.5


def test_explicit_values_apply_in_local_mode(tmp_path):
    s = load_settings({"VITVIZ_FORWARD_SLOTS": "2"}, folder=tmp_path)
    assert not s.public and s.forward_slots == 2 and s.uploads_per_minute == 0


def test_allow_is_stripped_and_deduplicated():
    assert ServeSettings(allow=(" a/b", "a/b", "", "demo ")).allow == ("a/b", "demo")


def test_describe():
    assert ServeSettings().describe() == "vitviz local mode (model memory 4 GiB; settings from defaults)"
    assert ServeSettings(public=True, allow=("x/y",), allow_hub_ids=True).describe() == (
        "vitviz public mode: 1 extra allowed models, typed hub ids up to 1 GB, model memory 4 GiB, "
        "1 forward slots, 10 uploads and 5 model changes per minute per session and per client address "
        "(settings from defaults)"
    )
    assert "per session (settings" in ServeSettings(public=True, per_address=False).describe()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"VITVIZ_PUBLIC": "maybe"}, "VITVIZ_PUBLIC must be 1/true/yes/on or 0/false/no/off, not 'maybe'."),
        ({"VITVIZ_FORWARD_SLOTS": "two"}, "VITVIZ_FORWARD_SLOTS must be a whole number, not 'two'."),
        ({"VITVIZ_FORWARD_SLOTS": "1.5"}, "VITVIZ_FORWARD_SLOTS must be a whole number, not '1.5'."),
        ({"VITVIZ_MAX_DOWNLOAD_GB": "lots"}, "VITVIZ_MAX_DOWNLOAD_GB must be a number, not 'lots'."),
        ({"VITVIZ_MODEL_MEMORY_GIB": "0"}, "model_memory_gib must be a positive number, not 0.0."),
        ({"VITVIZ_UPLOADS_PER_MINUTE": "-1"}, "uploads_per_minute must be 0 (no limit) or more, not -1."),
    ],
)
def test_bad_environment_values(tmp_path, env, message):
    with pytest.raises(SettingsError) as err:
        load_settings(env, folder=tmp_path)
    assert str(err.value) == message


def test_vitviz_config_must_exist(tmp_path):
    missing = tmp_path / "missing.toml"
    with pytest.raises(SettingsError) as err:
        load_settings({"VITVIZ_CONFIG": str(missing)}, folder=tmp_path)
    assert str(err.value) == "VITVIZ_CONFIG does not point to a file. Fix the path, or unset it."  # no path shown
    assert err.value.detail == f"VITVIZ_CONFIG points to {missing}, which is not a file. Fix the path, or unset it."


def test_unknown_key(tmp_path):
    path = write(tmp_path, "[public]\nenabled = true\nmax_downlod_gb = 2\n")
    with pytest.raises(SettingsError) as err:
        load_settings({}, folder=tmp_path)
    assert str(err.value) == (
        "vitviz.toml has unknown setting(s) max_downlod_gb in [public]; the known ones are enabled, allow, "
        "allow_hub_ids, max_download_gb, model_memory_gib, forward_slots, uploads_per_minute, "
        "model_changes_per_minute, hub_downloads_per_hour, hub_timeout_s, results_max_mb, results_max_rows, "
        "results_cache_mb, image_max_megapixels, image_max_side, decode_budget_mb, hub_max_layers, hub_max_width, "
        "hub_max_image_size, max_tokens, patching_max_work, per_address, address_table_size, saes, sae_indexes."
    )
    assert str(tmp_path) not in str(err.value)  # issue 23.15: a visitor never sees the server's folders
    assert err.value.detail == f"{err.value} (settings file: {path})"  # the server log gets the full path


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("enabled = 1", "'enabled' in {path} must be true or false, not 1."),
        (
            "allow = 'demo'",
            '\'allow\' in {path} must be a list of model names, like ["demo", "google/vit-base-patch16-224"].',
        ),
        ("forward_slots = 1.5", "'forward_slots' in {path} must be a whole number, not 1.5."),
        ("max_download_gb = 'big'", "'max_download_gb' in {path} must be a number, not 'big'."),
        ("max_download_gb = true", "'max_download_gb' in {path} must be a number, not True."),
    ],
)
def test_wrong_types_in_the_file(tmp_path, body, message):
    path = write(tmp_path, f"[public]\n{body}\n")
    with pytest.raises(SettingsError) as err:
        load_settings({}, folder=tmp_path)
    assert str(err.value) == message.format(path=path.name)
    assert str(path) in err.value.detail


def test_invalid_toml(tmp_path):
    path = write(tmp_path, "[public\nenabled = true\n")
    with pytest.raises(SettingsError) as err:
        load_settings({}, folder=tmp_path)
    assert str(err.value).startswith("vitviz.toml is not valid TOML (") and str(tmp_path) not in str(err.value)
    assert str(path) in err.value.detail
    assert str(err.value).endswith("). Fix the file, or remove it.")


def test_public_must_be_a_table(tmp_path):
    path = write(tmp_path, "public = true\n")
    with pytest.raises(SettingsError) as err:
        load_settings({}, folder=tmp_path)
    assert str(err.value) == "In vitviz.toml, 'public' must be a table: a line [public] followed by key = value lines."
    assert str(path) in err.value.detail


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        ServeSettings().public = True  # type: ignore[misc]


def test_the_working_directory_is_never_read(tmp_path, monkeypatch):
    """Issue 23.5: a server started from another directory read ./vitviz.toml (or silently none)."""
    app, elsewhere = tmp_path / "app", tmp_path / "elsewhere"
    app.mkdir(), elsewhere.mkdir()
    write(elsewhere, "[public]\nenabled = false\n")
    write(app, "[public]\nenabled = true\n")
    monkeypatch.chdir(elsewhere)
    s = load_settings({}, folder=app)
    assert s.public and s.origin == str(app / "vitviz.toml")
    monkeypatch.chdir(app)
    assert not load_settings({}, folder=elsewhere).public  # beside the app, whatever the working directory


def test_by_default_the_file_beside_app_py_is_read(tmp_path, monkeypatch):
    from vitviz.launch import app_script

    assert settings_mod.app_folder() == app_script().parent == ROOT
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "[public]\nenabled = true\n")  # in the working directory: ignored
    seen = []
    monkeypatch.setattr(settings_mod, "_read_toml", lambda path: seen.append(path) or {})
    load_settings({})
    assert seen == ([ROOT / "vitviz.toml"] if (ROOT / "vitviz.toml").is_file() else [])


def test_start_up_log_says_which_file_and_whether_public(tmp_path, capsys):
    import logging

    path = write(tmp_path, "[public]\nenabled = true\n")
    line = settings_mod.log_settings(load_settings({}, folder=tmp_path))
    assert line.startswith("vitviz public mode:") and line.endswith(f"(settings from {path})")
    assert line in capsys.readouterr().err
    assert settings_mod.server_log().level == logging.INFO


def test_input_limits_from_file_and_environment(tmp_path):
    write(tmp_path, "[public]\nresults_max_mb = 64\nimage_max_side = 4000\ndecode_budget_mb = 300\n")
    s = load_settings({"VITVIZ_RESULTS_MAX_ROWS": "1000", "VITVIZ_IMAGE_MAX_MEGAPIXELS": "12.5"}, folder=tmp_path)
    assert (s.results_max_mb, s.image_max_side, s.decode_budget_mb) == (64.0, 4000, 300.0)
    assert (s.results_max_rows, s.image_max_megapixels, s.results_cache_mb) == (1000, 12.5, 512.0)
    assert s.results_limits.max_bytes == 64 * 2**20 and s.results_limits.max_rows == 1000
    with pytest.raises(SettingsError, match="image_max_side must be a positive number"):
        ServeSettings(image_max_side=0)


def test_vitviz_app_logs_the_settings_at_start_and_stops_on_a_typo(tmp_path, monkeypatch, capsys):
    """Issue 23.5 / 23.15 for `vitviz app`: the settings are read and logged before Streamlit starts."""
    import socket
    import subprocess

    from vitviz.__main__ import main

    started = []

    class FakeServer:
        def __init__(self, cmd, env):
            started.append(cmd)

        def wait(self):
            return 0

        def poll(self):  # vitviz app asks whether the server is still running when it stops
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakeServer)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bad = write(tmp_path, "[public]\nenabled = yes\n")
    monkeypatch.setenv("VITVIZ_CONFIG", str(bad))
    assert main(["app", "--port", str(port)]) == 2  # an option that cannot work (issue 33.16; it was 1)
    err = capsys.readouterr().err
    assert f"(settings file: {bad})" in err and "Traceback" not in err and not started
    good = write(tmp_path, "[public]\nenabled = true\n", "good.toml")
    monkeypatch.setenv("VITVIZ_CONFIG", str(good))
    assert main(["app", "--port", str(port)]) == 0 and len(started) == 1
    assert "vitviz public mode: 0 extra allowed models, no typed hub ids" in capsys.readouterr().err


# -- issue 33.16: vitviz app checks and logs the settings at start ----------------------------------------------


def test_vitviz_app_logs_the_settings_line_before_starting_streamlit(tmp_path, monkeypatch, capsys):
    import subprocess

    from vitviz.__main__ import main

    monkeypatch.setenv("VITVIZ_CONFIG", str(write(tmp_path, "[public]\nenabled = true\n")))
    seen = []

    class Server:
        def __init__(self, *args, **kwargs):
            seen.append(capsys.readouterr().err)  # what the operator's terminal shows when Streamlit starts

        def wait(self):
            return 0

        def poll(self):  # vitviz app asks whether the server is still running when it stops
            return 0

    monkeypatch.setattr(subprocess, "Popen", Server)
    assert main(["app", "--port", str(_free_port())]) == 0
    assert len(seen) == 1 and "vitviz public mode:" in seen[0] and str(tmp_path / "vitviz.toml") in seen[0]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_operators_saes_and_indexes(tmp_path):
    write(tmp_path, '[public]\nenabled = true\nsaes = ["/srv/a", " /srv/b "]\nsae_indexes = ["/srv/a/i.parquet"]\n')
    s = load_settings({}, folder=tmp_path)
    assert s.saes == ("/srv/a", "/srv/b") and s.sae_indexes == ("/srv/a/i.parquet",)
    s = load_settings({"VITVIZ_SAE_INDEXES": "/x.parquet, /y.parquet"}, folder=tmp_path)
    assert s.sae_indexes == ("/x.parquet", "/y.parquet") and s.saes == ("/srv/a", "/srv/b")
    write(tmp_path, "[public]\nsaes = 3\n")
    with pytest.raises(SettingsError, match=r"'saes' in vitviz\.toml must be a list of paths on the server"):
        load_settings({}, folder=tmp_path)
