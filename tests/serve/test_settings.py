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
    s = load_settings({}, cwd=tmp_path)
    assert s == ServeSettings() and s.origin == "defaults"


def test_environment_switch(tmp_path):
    for on in ("1", "true", "YES", " on "):
        assert load_settings({"VITVIZ_PUBLIC": on}, cwd=tmp_path).public
    for off in ("0", "false", "no", "OFF", ""):
        assert not load_settings({"VITVIZ_PUBLIC": off}, cwd=tmp_path).public


def test_file_in_working_directory(tmp_path):
    write(tmp_path, FULL)
    s = load_settings({}, cwd=tmp_path)
    assert s.public and s.allow_hub_ids
    assert s.allow == ("demo", "demo-swin", "google/vit-base-patch16-224")
    assert (s.max_download_gb, s.model_memory_gib, s.hub_timeout_s) == (0.5, 2.0, 3.5)
    assert (s.forward_slots, s.uploads_per_minute, s.model_changes_per_minute, s.hub_downloads_per_hour) == (3, 4, 2, 7)
    assert s.origin == str(tmp_path / "vitviz.toml")


def test_file_from_vitviz_config(tmp_path):
    path = write(tmp_path, "[public]\nenabled = true\n", "elsewhere.toml")
    s = load_settings({"VITVIZ_CONFIG": str(path)}, cwd=tmp_path / "nowhere")
    assert s.public and s.origin == str(path)


def test_example_file_parses(tmp_path):
    example = ROOT / "vitviz.toml.example"
    s = load_settings({"VITVIZ_CONFIG": str(example)}, cwd=tmp_path)
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
    s = load_settings(env, cwd=tmp_path)
    assert not s.public and not s.allow_hub_ids
    assert s.allow == ("a/b", "c/d")  # replaces the file's list
    assert (s.max_download_gb, s.model_memory_gib, s.hub_timeout_s) == (2.5, 8.0, 1.0)
    assert (s.forward_slots, s.uploads_per_minute, s.model_changes_per_minute, s.hub_downloads_per_hour) == (2, 1, 0, 3)
    assert s.origin.startswith(str(tmp_path / "vitviz.toml") + "; environment VITVIZ_PUBLIC, VITVIZ_ALLOW")


def test_file_without_enabled_stays_local_but_keeps_its_values(tmp_path):
    write(tmp_path, "[public]\nmodel_memory_gib = 1.5\n[other]\nx = 1\n")
    s = load_settings({}, cwd=tmp_path)
    assert not s.public and s.model_memory_gib == 1.5
    assert load_settings({"VITVIZ_PUBLIC": "1"}, cwd=tmp_path).model_memory_gib == 1.5


def test_explicit_values_apply_in_local_mode(tmp_path):
    s = load_settings({"VITVIZ_FORWARD_SLOTS": "2"}, cwd=tmp_path)
    assert not s.public and s.forward_slots == 2 and s.uploads_per_minute == 0


def test_allow_is_stripped_and_deduplicated():
    assert ServeSettings(allow=(" a/b", "a/b", "", "demo ")).allow == ("a/b", "demo")


def test_describe():
    assert ServeSettings().describe() == "vitviz local mode (model memory 4 GiB; settings from defaults)"
    assert ServeSettings(public=True, allow=("x/y",), allow_hub_ids=True).describe() == (
        "vitviz public mode: 1 extra allowed models, typed hub ids up to 1 GB, model memory 4 GiB, "
        "1 forward slots, 10 uploads and 5 model changes per minute per session (settings from defaults)"
    )


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
        load_settings(env, cwd=tmp_path)
    assert str(err.value) == message


def test_vitviz_config_must_exist(tmp_path):
    missing = tmp_path / "missing.toml"
    with pytest.raises(SettingsError) as err:
        load_settings({"VITVIZ_CONFIG": str(missing)}, cwd=tmp_path)
    assert str(err.value) == f"VITVIZ_CONFIG points to {missing}, which is not a file. Fix the path, or unset it."


def test_unknown_key(tmp_path):
    path = write(tmp_path, "[public]\nenabled = true\nmax_downlod_gb = 2\n")
    with pytest.raises(SettingsError) as err:
        load_settings({}, cwd=tmp_path)
    assert str(err.value) == (
        f"{path} has unknown setting(s) max_downlod_gb in [public]; the known ones are enabled, allow, "
        "allow_hub_ids, max_download_gb, model_memory_gib, forward_slots, uploads_per_minute, "
        "model_changes_per_minute, hub_downloads_per_hour, hub_timeout_s."
    )


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
        load_settings({}, cwd=tmp_path)
    assert str(err.value) == message.format(path=path)


def test_invalid_toml(tmp_path):
    path = write(tmp_path, "[public\nenabled = true\n")
    with pytest.raises(SettingsError) as err:
        load_settings({}, cwd=tmp_path)
    assert str(err.value).startswith(f"{path} is not valid TOML (")
    assert str(err.value).endswith("). Fix the file, or remove it.")


def test_public_must_be_a_table(tmp_path):
    path = write(tmp_path, "public = true\n")
    with pytest.raises(SettingsError) as err:
        load_settings({}, cwd=tmp_path)
    assert str(err.value) == f"In {path}, 'public' must be a table: a line [public] followed by key = value lines."


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        ServeSettings().public = True  # type: ignore[misc]
