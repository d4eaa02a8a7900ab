"""Model policy of public mode: exact refusals, no file-system oracle, hub checks before any download.

Every hub call goes to a fake; nothing here touches the network.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RemoteEntryNotFoundError,
    RepositoryNotFoundError,
)
from huggingface_hub.hf_api import ModelInfo

from vitviz.errors import ModelLoadError, VitvizError
from vitviz.models.families import supported_model_types
from vitviz.serve import policy
from vitviz.serve.policy import Hub, ModelRequest, PolicyError, check_model_request, load_request, vet_model_request
from vitviz.serve.settings import ServeSettings

PRESETS = ("demo", "google/vit-base-patch16-224", "facebook/dinov2-small")
PUBLIC = ServeSettings(public=True, allow=("acme/special-vit", "/srv/models/house-vit"))
OPEN = ServeSettings(public=True, allow_hub_ids=True, max_download_gb=1.0)
SHA = "0123456789abcdef0123456789abcdef01234567"


def hub_error(cls: type[Exception], status: int, message: str = "error") -> Exception:
    """A huggingface_hub HTTP error without building an HTTP response."""
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    exc.response = SimpleNamespace(status_code=status, headers={})
    return exc


class FakeHub:
    """Records every call; ``info`` is what model_info returns (or raises), ``config`` what config.json holds."""

    def __init__(self, tmp: Path, info=None, config=None, download_error=None, snapshot_folder=None):
        self.tmp, self.info, self.config = tmp, info, config
        self.download_error, self.snapshot_folder = download_error, snapshot_folder
        self.calls: list[tuple[str, tuple, dict]] = []

    def model_info(self, repo_id, **kwargs):
        self.calls.append(("model_info", (repo_id,), kwargs))
        if isinstance(self.info, BaseException):
            raise self.info
        return self.info

    def download(self, repo_id, filename, **kwargs):
        self.calls.append(("download", (repo_id, filename), kwargs))
        if self.download_error is not None:
            raise self.download_error
        path = self.tmp / "hub-config.json"
        path.write_text(self.config if isinstance(self.config, str) else json.dumps(self.config))
        return str(path)

    def snapshot(self, repo_id, **kwargs):
        self.calls.append(("snapshot", (repo_id,), kwargs))
        if isinstance(self.snapshot_folder, BaseException):
            raise self.snapshot_folder
        return str(self.snapshot_folder)

    def hub(self) -> Hub:
        return Hub(model_info=self.model_info, download=self.download, snapshot=self.snapshot)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def info(siblings: dict[str, int | None], *, params: int | None = None, **extra) -> ModelInfo:
    """A real ModelInfo as ``HfApi().model_info(files_metadata=True)`` returns it."""
    return ModelInfo(
        id="x/y",
        sha=SHA,
        siblings=[{"rfilename": name, "size": size} for name, size in siblings.items()],
        safetensors={"parameters": {"F32": params}, "total": params} if params else None,
        **extra,
    )


GOOD_FILES = {
    "config.json": 700,
    "preprocessor_config.json": 300,
    "model.safetensors": 340_000_000,
    "pytorch_model.bin": 340_000_000,  # ignored: safetensors exist
    "tf_model.h5": 340_000_000,  # ignored: not loaded
    "onnx/model.safetensors": 900_000_000,  # ignored: a subfolder
    "README.md": 5_000,
}


def refused(name: str, settings: ServeSettings = PUBLIC, hub: Hub | None = None) -> PolicyError:
    with pytest.raises(PolicyError) as err:
        check_model_request(name, settings, PRESETS, hub=hub)
    assert isinstance(err.value, VitvizError)
    return err.value


def never_called_hub() -> Hub:
    def boom(*args, **kwargs):
        raise AssertionError("the hub must not be called")

    return Hub(model_info=boom, download=boom, snapshot=boom)


# -- local mode ---------------------------------------------------------------------------------


def test_local_mode_checks_nothing(tmp_path):
    local = ServeSettings()
    for name in (" /etc ", str(tmp_path), "../..", "someone/any-model", "demo"):
        assert check_model_request(name, local, PRESETS, hub=never_called_hub()) == name.strip()


# -- allowlist ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["demo", "google/vit-base-patch16-224", " facebook/dinov2-small ", "acme/special-vit", "/srv/models/house-vit"],
)
def test_allowlisted_names_pass_without_the_hub(name):
    req = vet_model_request(name, PUBLIC, PRESETS, hub=never_called_hub())
    assert req == ModelRequest(name.strip())
    assert not req.hub


def test_allowlist_is_presets_demos_then_operator():
    from vitviz.demo import bundled

    extra = [d for d in bundled() if d not in PRESETS]  # the bundled models present in this checkout
    assert policy.allowlist(PUBLIC, PRESETS) == (*PRESETS, *extra, "acme/special-vit", "/srv/models/house-vit")
    for name in bundled():
        assert vet_model_request(name, PUBLIC, (), hub=never_called_hub()) == ModelRequest(name)


def test_empty_name():
    err = refused("   ")
    assert str(err) == "No model given: choose one of the models in the list." and err.reason == "empty"


# -- path probing: one message, whatever is on disk ----------------------------------------------


def probe_names(tmp_path: Path) -> list[str]:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    file = tmp_path / "a-file.txt"
    file.write_text("secret")
    return [
        str(folder),  # an existing folder (even a model folder)
        str(folder / "config.json"),  # an existing file
        str(file),
        str(tmp_path / "nothing-here"),  # nothing
        "../..",
        "..",
        "/",
        "/etc/passwd",
        "~",
        "~/.ssh",
        "./a-folder",
        "a-folder",  # relative, existing (cwd is tmp_path)
        "nothing",  # relative, missing
        "a/../b",
        "owner/name/extra",
        "C:\\Windows",
        "file:///etc/passwd",
        "demo/..",
        "vitviz",
    ]


def test_path_probing_gets_one_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    messages = {}
    for name in probe_names(tmp_path):
        err = refused(name, hub=never_called_hub())
        assert err.reason == "path"
        messages[name] = str(err)
    assert set(messages.values()) == {
        "This public server does not open files or folders typed here. Choose a model from the list."
    }
    assert policy.PATH_REFUSED in messages.values()


def test_path_probing_with_hub_ids_allowed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    messages = {str(refused(name, OPEN, hub=never_called_hub())) for name in probe_names(tmp_path)}
    assert messages == {
        "This public server does not open files or folders typed here. Choose a model from the list, "
        "or type a Hugging Face model id of the form owner/name (e.g. google/vit-base-patch16-224)."
    }


def test_hub_shaped_folder_is_treated_as_a_hub_id_whether_or_not_it_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner" / "name").mkdir(parents=True)
    (tmp_path / "owner" / "file").write_text("x")
    texts = {n: str(refused(n)) for n in ("owner/name", "owner/file", "owner/missing")}
    assert {t.replace(n, "NAME") for n, t in texts.items()} == {policy.HUB_ID_REFUSED.format(name="NAME")}


# -- hub ids -----------------------------------------------------------------------------------


def test_disallowed_hub_id():
    err = refused("someone/huge-model", hub=never_called_hub())
    assert err.reason == "hub_id"
    assert str(err) == (
        "'someone/huge-model' is not one of the models this server offers, and it does not download other models "
        "from the Hugging Face hub. Choose a model from the list."
    )


def test_allowed_hub_id_is_checked_then_pinned(tmp_path):
    fake = FakeHub(tmp_path, info(GOOD_FILES, params=86_000_000), {"model_type": "vit"})
    req = vet_model_request("someone/my-vit", OPEN, PRESETS, hub=fake.hub())
    assert req.name == "someone/my-vit" and req.hub and req.revision == SHA
    assert req.files == ("config.json", "model.safetensors", "preprocessor_config.json")
    assert req.download_bytes == 340_001_000
    assert req.memory_bytes == 344_000_000  # 86 M float32 parameters
    assert fake.names() == ["model_info", "download"]
    assert fake.calls[0] == (
        "model_info",
        ("someone/my-vit",),
        {"files_metadata": True, "timeout": 10.0, "token": False},
    )
    assert fake.calls[1] == (
        "download",
        ("someone/my-vit", "config.json"),
        {"revision": SHA, "token": False, "etag_timeout": 10.0},
    )
    assert check_model_request("someone/my-vit", OPEN, PRESETS, hub=fake.hub()) == "someone/my-vit"


def test_memory_estimate_without_parameter_count(tmp_path):
    fake = FakeHub(tmp_path, info({"config.json": 1, "model.safetensors": 1000}), {"model_type": "dinov2"})
    assert vet_model_request("a/b", OPEN, hub=fake.hub()).memory_bytes == 1000


def test_oversize_checkpoint_is_refused_from_metadata_before_any_download(tmp_path):
    fake = FakeHub(tmp_path, info({"config.json": 700, "model.safetensors": 2_400_000_000}), {"model_type": "vit"})
    err = refused("someone/vit-huge", OPEN, fake.hub())
    assert err.reason == "too_large"
    assert str(err) == (
        "'someone/vit-huge' needs a 2.40 GB download, more than the 1 GB this server allows per model. "
        "Choose a smaller checkpoint, or a model from the list."
    )
    assert fake.names() == ["model_info"]  # neither config.json nor any weight was downloaded


def test_sharded_weights_are_summed(tmp_path):
    files = {
        "config.json": 1,
        "model.safetensors.index.json": 50_000,
        "model-00001-of-00002.safetensors": 600_000_000,
        "model-00002-of-00002.safetensors": 600_000_000,
    }
    fake = FakeHub(tmp_path, info(files), {"model_type": "vit"})
    err = refused("someone/sharded", ServeSettings(public=True, allow_hub_ids=True, max_download_gb=1.1), fake.hub())
    assert err.reason == "too_large" and "needs a 1.20 GB download, more than the 1.1 GB" in str(err)
    assert fake.names() == ["model_info"]


def test_pickle_sizes_count_when_there_is_no_safetensors(tmp_path):
    fake = FakeHub(tmp_path, info({"config.json": 1, "pytorch_model.bin": 3_000_000_000}), {"model_type": "vit"})
    assert refused("old/big", OPEN, fake.hub()).reason == "too_large"
    assert fake.names() == ["model_info"]


def test_pickle_only_checkpoint(tmp_path):
    fake = FakeHub(tmp_path, info({"config.json": 1, "pytorch_model.bin": 1000}), {"model_type": "vit"})
    err = refused("old/pickled", OPEN, fake.hub())
    assert err.reason == "pickle"
    assert str(err) == (
        "'old/pickled' has only pickle weights (pytorch_model.bin), which can run arbitrary code when loaded; this "
        "server loads safetensors only. Choose a checkpoint with model.safetensors, or a model from the list."
    )
    assert fake.names() == ["model_info"]


def test_unsupported_family_from_config_json(tmp_path):
    fake = FakeHub(tmp_path, info({"config.json": 1, "model.safetensors": 1000}), {"model_type": "resnet"})
    err = refused("microsoft/resnet-50", OPEN, fake.hub())
    assert err.reason == "unsupported"
    assert str(err) == (
        f"'microsoft/resnet-50' is a 'resnet' model, which vitviz does not explain: it supports the model types "
        f"{', '.join(supported_model_types())}. Choose a Vision Transformer checkpoint, or a model from the list."
    )
    assert fake.names() == ["model_info", "download"]
    assert fake.calls[1][1] == ("microsoft/resnet-50", "config.json")


@pytest.mark.parametrize(
    ("config", "detail"),
    [
        ("{not json", "it is not valid JSON"),
        ({"architectures": ["X"]}, "it names no model_type"),
        ([1, 2], "it names no model_type"),
    ],
)
def test_unreadable_config(tmp_path, config, detail):
    fake = FakeHub(tmp_path, info({"config.json": 1, "model.safetensors": 1000}), config)
    err = refused("a/b", OPEN, fake.hub())
    assert err.reason == "bad_config"
    assert str(err) == f"The config.json of 'a/b' cannot be read ({detail}). Choose a model from the list."


def test_oversize_config_is_not_downloaded(tmp_path):
    fake = FakeHub(tmp_path, info({"config.json": 5_000_000, "model.safetensors": 1000}), {"model_type": "vit"})
    err = refused("a/b", OPEN, fake.hub())
    assert str(err) == "The config.json of 'a/b' cannot be read (it is larger than 1 MB). Choose a model from the list."
    assert fake.names() == ["model_info"]


def test_no_config(tmp_path):
    fake = FakeHub(tmp_path, info({"model.safetensors": 1000}))
    err = refused("a/b", OPEN, fake.hub())
    assert err.reason == "no_config"
    assert str(err) == (
        "'a/b' has no config.json on the Hugging Face hub, so it is not a transformers model vitviz can load. "
        "Choose a model from the list."
    )
    fake = FakeHub(
        tmp_path,
        info({"config.json": 1, "model.safetensors": 1}),
        download_error=hub_error(RemoteEntryNotFoundError, 404),
    )
    assert refused("a/b", OPEN, fake.hub()).reason == "no_config"


def test_no_weights(tmp_path):
    fake = FakeHub(tmp_path, info({"config.json": 1, "flax_model.msgpack": 1000, "sub/model.safetensors": 5}))
    err = refused("a/b", OPEN, fake.hub())
    assert err.reason == "no_weights"
    assert str(err) == (
        "'a/b' has no model weights (model.safetensors) on the Hugging Face hub. "
        "Choose a checkpoint that has them, or a model from the list."
    )


def test_unknown_size(tmp_path):
    fake = FakeHub(tmp_path, info({"config.json": 1, "model.safetensors": None}))
    err = refused("a/b", OPEN, fake.hub())
    assert err.reason == "unknown_size"
    assert str(err) == (
        "The Hugging Face hub does not report the size of every file of 'a/b', so this server cannot check "
        "it before downloading. Choose a model from the list."
    )
    assert fake.names() == ["model_info"]


NOT_FOUND = (
    "'a/b' is not a public model on the Hugging Face hub (it does not exist, or it is private or gated). "
    "Check the spelling, or choose a model from the list."
)
UNREACHABLE = (
    "The Hugging Face hub cannot be reached from this server right now, so 'a/b' cannot be checked. "
    "Choose a model from the list, or try again later."
)


@pytest.mark.parametrize(
    "error",
    [hub_error(RepositoryNotFoundError, 404), hub_error(GatedRepoError, 403), hub_error(HfHubHTTPError, 401)],
)
def test_missing_or_gated_repository(tmp_path, error):
    fake = FakeHub(tmp_path, error)
    err = refused("a/b", OPEN, fake.hub())
    assert err.reason == "not_found" and str(err) == NOT_FOUND


@pytest.mark.parametrize("flags", [{"gated": "auto"}, {"private": True}, {"disabled": True}])
def test_gated_or_private_metadata(tmp_path, flags):
    fake = FakeHub(tmp_path, info({"config.json": 1, "model.safetensors": 1}, **flags), {"model_type": "vit"})
    assert str(refused("a/b", OPEN, fake.hub())) == NOT_FOUND
    assert fake.names() == ["model_info"]


@pytest.mark.parametrize(
    "error",
    [
        OfflineModeIsEnabled("offline"),
        ConnectionError("no route"),
        TimeoutError("slow"),
        hub_error(HfHubHTTPError, 503),
    ],
)
def test_hub_unreachable(tmp_path, error):
    fake = FakeHub(tmp_path, error)
    err = refused("a/b", OPEN, fake.hub())
    assert err.reason == "unreachable" and str(err) == UNREACHABLE
    fake = FakeHub(tmp_path, info({"config.json": 1, "model.safetensors": 1}), download_error=error)
    assert str(refused("a/b", OPEN, fake.hub())) == UNREACHABLE


def test_timeout_setting_reaches_the_hub(tmp_path):
    fake = FakeHub(tmp_path, info({"config.json": 1, "model.safetensors": 1}), {"model_type": "vit"})
    vet_model_request("a/b", ServeSettings(public=True, allow_hub_ids=True, hub_timeout_s=2.5), hub=fake.hub())
    assert fake.calls[0][2]["timeout"] == 2.5 and fake.calls[1][2]["etag_timeout"] == 2.5


def test_default_hub_uses_huggingface_hub():
    hub = Hub.default()
    assert hub.model_info.__name__ == "model_info"
    assert hub.download.__name__ == "hf_hub_download" and hub.snapshot.__name__ == "snapshot_download"


# -- loading what was allowed -------------------------------------------------------------------


@dataclass(frozen=True)
class FakeLoaded:
    name: str
    source: str


def test_load_request_allowlisted_goes_to_load_model(tmp_path):
    fake = FakeHub(tmp_path)
    got = load_request(ModelRequest("demo"), load=lambda n: FakeLoaded(n, "here"), hub=fake.hub())
    assert got == FakeLoaded("demo", "here") and fake.calls == []


def test_load_request_downloads_only_the_vetted_files(tmp_path):
    folder = tmp_path / "snapshots" / SHA
    fake = FakeHub(tmp_path, snapshot_folder=folder)
    req = ModelRequest("a/b", hub=True, revision=SHA, files=("config.json", "model.safetensors"), download_bytes=10**8)
    progress: list[str] = []
    seen: list[str] = []
    got = load_request(
        req, load=lambda p: seen.append(p) or FakeLoaded(p, p), hub=fake.hub(), on_progress=progress.append
    )
    assert fake.calls == [
        (
            "snapshot",
            ("a/b",),
            {
                "revision": SHA,
                "allow_patterns": ["config.json", "model.safetensors"],
                "token": False,
                "etag_timeout": 10.0,
            },
        )
    ]
    assert seen == [str(folder)]
    assert got == FakeLoaded("a/b", "a/b")  # the server's cache path is not shown
    assert progress == ["Downloading a/b (0.10 GB) from the Hugging Face hub…", "Reading a/b…"]


def test_load_request_download_failure(tmp_path):
    req = ModelRequest("a/b", hub=True, revision=SHA, files=("config.json",))
    fake = FakeHub(tmp_path, snapshot_folder=OSError(f"No space left on device: {tmp_path}"))
    with pytest.raises(PolicyError) as err:
        load_request(req, load=lambda p: None, hub=fake.hub())
    assert err.value.reason == "download"
    assert str(err.value) == (
        "Downloading 'a/b' from the Hugging Face hub failed (OSError). Try again later, or choose a model from the list."
    )
    fake = FakeHub(tmp_path, snapshot_folder=hub_error(RepositoryNotFoundError, 404))
    with pytest.raises(PolicyError) as err:
        load_request(req, load=lambda p: None, hub=fake.hub())
    assert str(err.value) == NOT_FOUND


def test_load_request_errors_name_the_hub_id_not_the_cache(tmp_path):
    folder = tmp_path / "cache" / "snap"
    fake = FakeHub(tmp_path, snapshot_folder=folder)

    def load(path):
        raise ModelLoadError(f"Could not load the weights of '{path}': broken.")

    with pytest.raises(ModelLoadError) as err:
        load_request(ModelRequest("a/b", hub=True, files=("config.json",)), load=load, hub=fake.hub())
    assert str(err.value) == "Could not load the weights of 'a/b': broken."


def test_vetted_hub_model_loads_for_real(tmp_path, tiny_dirs):
    """End to end with a tiny real checkpoint standing in for the hub's snapshot."""
    folder = tiny_dirs["vit"]
    files = {p.name: p.stat().st_size for p in folder.iterdir()}
    fake = FakeHub(tmp_path, info(files), json.loads((folder / "config.json").read_text()), snapshot_folder=folder)
    req = vet_model_request("someone/tiny-vit", OPEN, PRESETS, hub=fake.hub())
    assert set(req.files) == set(files)
    loaded = load_request(req, hub=fake.hub())
    assert loaded.name == loaded.source == "someone/tiny-vit"
    assert loaded.family.name and loaded.patch_size == 8


def test_load_request_refuses_a_model_over_max_bytes_before_building_it(tmp_path, tiny_dirs):
    """Issue 33.7: public mode passes the model memory, so a config larger than it is refused from its config."""
    from vitviz.errors import ModelLoadError

    folder = tiny_dirs["vit"]
    files = {p.name: p.stat().st_size for p in folder.iterdir()}
    fake = FakeHub(tmp_path, info(files), json.loads((folder / "config.json").read_text()), snapshot_folder=folder)
    req = vet_model_request("someone/tiny-vit", OPEN, PRESETS, hub=fake.hub())
    with pytest.raises(ModelLoadError, match=r"refused before loading: its config\.json asks for a model of") as err:
        load_request(req, hub=fake.hub(), max_bytes=1000)
    assert "someone/tiny-vit" in str(err.value) and str(folder) not in str(err.value)
    assert load_request(req, hub=fake.hub(), max_bytes=10**9).patch_size == 8
