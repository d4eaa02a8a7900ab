"""Issue 23.6: a typed hub id's config and weights index are checked before any weight is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub.errors import RepositoryNotFoundError
from huggingface_hub.hf_api import ModelInfo

from vitviz.errors import ModelLoadError
from vitviz.serve.hub_checks import DEFAULT_LIMITS, config_problem
from vitviz.serve.policy import Hub, PolicyError, vet_model_request
from vitviz.serve.settings import ServeSettings

OPEN = ServeSettings(public=True, allow_hub_ids=True, max_download_gb=1.0)
CLOSED = ServeSettings(public=True)
SHA = "0123456789abcdef0123456789abcdef01234567"
VIT_BASE = {
    "model_type": "vit",
    "num_hidden_layers": 12,
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_attention_heads": 12,
    "image_size": 224,
    "patch_size": 16,
}


class Files:
    """A fake hub repository: ``files`` name -> text; records every call."""

    def __init__(self, tmp: Path, files: dict[str, str], sizes: dict[str, int] | None = None, exists: bool = True):
        self.tmp, self.files, self.exists = tmp, files, exists
        self.sizes = {name: len(text) for name, text in files.items()} | (sizes or {})
        self.calls: list[tuple[str, str]] = []

    def model_info(self, repo_id, **kw):
        self.calls.append(("model_info", repo_id))
        if not self.exists:
            raise RepositoryNotFoundError("no such repo")
        siblings = [{"rfilename": n, "size": s} for n, s in self.sizes.items()]
        return ModelInfo(id=repo_id, sha=SHA, siblings=siblings)

    def download(self, repo_id, filename, **kw):
        self.calls.append(("download", filename))
        path = self.tmp / filename.replace("/", "_")
        path.write_text(self.files[filename])
        return str(path)

    def snapshot(self, repo_id, **kw):
        raise AssertionError("nothing is downloaded before the checks pass")

    def hub(self) -> Hub:
        return Hub(model_info=self.model_info, download=self.download, snapshot=self.snapshot)


def _repo(tmp_path, config: dict, **extra: str) -> Files:
    return Files(tmp_path, {"config.json": json.dumps(config), **extra}, sizes={"model.safetensors": 300_000_000})


def test_a_real_sized_config_passes(tmp_path):
    fake = _repo(tmp_path, VIT_BASE)
    assert vet_model_request("someone/vit", OPEN, hub=fake.hub()).hub
    assert config_problem(VIT_BASE, OPEN.model_memory_bytes) is None


@pytest.mark.parametrize(
    "change,what",
    [
        ({"num_hidden_layers": 3000}, "num_hidden_layers = 3,000"),
        ({"hidden_size": 100_000}, "hidden_size = 100,000"),
        ({"image_size": 100_000}, "image_size = 100,000"),
        ({"patch_size": 1, "image_size": 1024}, "1,048,576 tokens"),
        ({"num_labels": 10_000_000}, "num_labels = 10,000,000"),
        ({"text_config": {"vocab_size": 10**9}}, "text_config.vocab_size"),
        ({"num_hidden_layers": 60, "hidden_size": 4096, "intermediate_size": 16384}, "parameters"),
    ],
    ids=["layers", "width", "image", "tokens", "labels", "text tower", "memory"],
)
def test_size_fields_of_the_config_are_checked_before_any_weight(tmp_path, change, what):
    fake = _repo(tmp_path, {**VIT_BASE, **change})
    with pytest.raises(PolicyError) as err:
        vet_model_request("someone/vit", OPEN, hub=fake.hub())
    assert err.value.reason == "config_too_large" and what in str(err.value)
    assert [c for c in fake.calls if c[0] == "download"] == [("download", "config.json")]


def test_hierarchical_depths_count_in_all():
    swin = {"model_type": "swin", "depths": [2, 2, 60, 2], "embed_dim": 96, "image_size": 224, "patch_size": 4}
    assert config_problem(swin, None)[0] == "depths"
    assert config_problem({**swin, "depths": [2, 2, 18, 2]}, None) is None
    assert DEFAULT_LIMITS.layers == 64


SWIN_TINY = {
    "model_type": "swin",
    "depths": [2, 2, 6, 2],
    "num_heads": [3, 6, 12, 24],
    "embed_dim": 96,
    "image_size": 224,
    "patch_size": 4,
    "window_size": 7,
    "mlp_ratio": 4.0,
}


def test_every_familys_config_is_counted_before_any_weight(tmp_path):
    """Issue 33.7: a Swin config with mlp_ratio 20000 passed the hub check (no field says its size)."""
    from vitviz.serve.hub_checks import config_footprint

    assert 27e6 < config_footprint(SWIN_TINY).parameters < 29e6  # Swin-T: 28 million
    fake = _repo(tmp_path, SWIN_TINY)
    assert vet_model_request("someone/swin", OPEN, hub=fake.hub()).hub
    fake = _repo(tmp_path, {**SWIN_TINY, "mlp_ratio": 20000.0})
    with pytest.raises(PolicyError) as err:
        vet_model_request("someone/swin", OPEN, hub=fake.hub())
    assert err.value.reason == "config_too_large" and "parameters and buffers" in str(err.value)
    assert [c for c in fake.calls if c[0] == "download"] == [("download", "config.json")]


def test_a_config_no_model_can_be_built_from_is_refused(tmp_path):
    fake = _repo(tmp_path, {**SWIN_TINY, "embed_dim": "wide"})
    with pytest.raises(PolicyError) as err:
        vet_model_request("someone/swin", OPEN, hub=fake.hub())
    assert err.value.reason == "bad_config"
    too_many = {**SWIN_TINY, "depths": [0] * 1_000_000, "num_heads": [1] * 1_000_000}
    assert config_problem(too_many, None)[0] == "depths"  # before a million stages are built
    assert config_problem({"model_type": "cct", "num_layers": 10**6}, None)[0] == "num_layers"  # CCT's name


INDEX = "model.safetensors.index.json"


@pytest.mark.parametrize(
    "target,ok",
    [
        ("model-00001-of-00002.safetensors", True),
        ("../../models--other--model/snapshots/abc/model.safetensors", False),
        ("/root/.cache/huggingface/hub/x/model.safetensors", False),
        ("sub/model-00001-of-00002.safetensors", False),
        ("missing.safetensors", False),
    ],
    ids=["own shard", "another cached model", "absolute", "subfolder", "not in the repository"],
)
def test_weights_index_entries_outside_the_repository_are_refused(tmp_path, target, ok):
    index = {"weight_map": {"a": target, "b": "model-00002-of-00002.safetensors"}}
    fake = Files(
        tmp_path,
        {"config.json": json.dumps(VIT_BASE), INDEX: json.dumps(index)},
        sizes={"model-00001-of-00002.safetensors": 10, "model-00002-of-00002.safetensors": 10},
    )
    if ok:
        assert vet_model_request("someone/sharded", OPEN, hub=fake.hub()).hub
        return
    with pytest.raises(PolicyError) as err:
        vet_model_request("someone/sharded", OPEN, hub=fake.hub())
    assert err.value.reason == "bad_index" and target not in str(err.value)


def test_a_local_folder_whose_index_points_outside_is_refused(tmp_path, tiny_dirs):
    import shutil

    from vitviz.models.load import load_model

    folder = tmp_path / "m"
    shutil.copytree(tiny_dirs["vit"], folder)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00001.safetensors")
    from safetensors import safe_open

    with safe_open(folder / "model-00001-of-00001.safetensors", "pt") as fh:
        keys = list(fh.keys())
    size = (folder / "model-00001-of-00001.safetensors").stat().st_size
    index = {"metadata": {"total_size": size}, "weight_map": {k: "model-00001-of-00001.safetensors" for k in keys}}
    (folder / INDEX).write_text(json.dumps(index))
    assert load_model(str(folder), device="cpu").family.name == "ViT"  # a sound index loads
    index["weight_map"][next(iter(index["weight_map"]))] = f"../{tiny_dirs['deit'].name}/model.safetensors"
    (folder / INDEX).write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="outside"):
        load_model(str(folder), device="cpu")


def test_without_hub_ids_the_message_never_says_whether_an_id_exists(tmp_path):
    messages = set()
    for exists in (True, False):
        fake = Files(tmp_path, {"config.json": json.dumps({**VIT_BASE, "num_hidden_layers": 3000})}, exists=exists)
        with pytest.raises(PolicyError) as err:
            vet_model_request("someone/vit", CLOSED, hub=fake.hub())
        assert fake.calls == []  # the hub is not even asked
        messages.add((str(err.value), err.value.reason))
    assert len(messages) == 1


def test_a_hub_config_naming_code_is_refused_before_any_weight(tmp_path):
    fake = _repo(tmp_path, {**VIT_BASE, "auto_map": {"AutoConfig": "evil.EvilConfig"}})
    with pytest.raises(PolicyError) as err:
        vet_model_request("someone/evil", OPEN, hub=fake.hub())
    assert err.value.reason == "remote_code" and "auto_map" in str(err.value)
    assert [c for c in fake.calls if c[0] == "download"] == [("download", "config.json")]


def test_the_hub_config_limits_come_from_the_settings():
    """vitviz.toml's hub_max_layers (and width, image size) bound a typed hub id's config before any download."""
    from vitviz.serve.hub_checks import ConfigLimits, config_problem
    from vitviz.serve.settings import ServeSettings

    config = {"model_type": "vit", "num_hidden_layers": 24, "hidden_size": 64, "image_size": 224}
    s = ServeSettings(public=True, hub_max_layers=12)
    limits = ConfigLimits(layers=s.hub_max_layers, width=s.hub_max_width, image_size=s.hub_max_image_size)
    problem = config_problem(config, None, limits)
    assert problem is not None and "24" in problem[1] and "12" in problem[2]
    assert config_problem(config, None) is None  # the default allows 64
