import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import EXPECTED_PREFIX, FAMILY_KEYS, HIER_KEYS, save_tiny

from vitviz.errors import ModelLoadError, UnsupportedModelError
from vitviz.models.load import DEMO_NAME, load_model, parse_model_name, pick_device


@pytest.mark.parametrize("key", FAMILY_KEYS)
def test_every_family_loads_with_eager_attention(tiny_models, key):
    loaded = tiny_models[key]
    # vitviz's attention function: eager attention's numbers, its pattern a point (tests/models/test_registry.py)
    assert loaded.model.config._attn_implementation == "vitviz"
    assert loaded.family.prefix_kinds(loaded.config) == EXPECTED_PREFIX[key]
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert not loaded.model.training
    assert loaded.device.type == "cpu"


def test_classifier_and_backbones(tiny_models):
    assert tiny_models["vit"].id2label == {0: "zero", 1: "one", 2: "two"}
    assert tiny_models["deit"].has_classifier
    assert not tiny_models["dino"].has_classifier
    assert not tiny_models["dinov2"].has_classifier


def test_position_embeddings_per_family(tiny_models):
    for key in ("vit", "deit", "dino"):
        assert tiny_models[key].position_embeddings.shape == (16, 32)  # prefix rows dropped
        assert tiny_models[key].position_grid == (4, 4)
    for key in ("dinov2", "dinov2_registers"):
        assert tiny_models[key].position_embeddings.shape == (64, 32)
    # DeiT: the two prefix rows (CLS, DIST) are dropped, not the last row
    table = tiny_models["deit"].base_model.embeddings.position_embeddings[0]
    np.testing.assert_array_equal(tiny_models["deit"].position_embeddings, table[2:].numpy())
    beit = tiny_models["beit"]
    assert beit.position_embeddings is None and "relative position bias" in beit.position_note


def test_demo_model_loads_by_name():
    loaded = load_model(DEMO_NAME, device="cpu")
    assert loaded.family.name == "ViT"
    assert loaded.patch_size == 8 and loaded.default_size == (96, 96)
    assert set(loaded.id2label.values()) == {"circle", "square", "triangle", "cross", "star"}


@pytest.mark.parametrize(
    "arch,cfg_name,family",
    [("ResNetModel", "ResNetConfig", "resnet"), ("ConvNextModel", "ConvNextConfig", "convnext")],
)
def test_unsupported_family_named(tmp_path, arch, cfg_name, family):
    import transformers

    cfg = getattr(transformers, cfg_name)(
        **(
            {"hidden_sizes": [8], "depths": [1], "num_stages": 1}
            if family == "convnext"
            else {"hidden_sizes": [8], "depths": [1], "embedding_size": 8}
        )
    )
    getattr(transformers, arch)(cfg).save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(UnsupportedModelError, match=f"'{family}' models are not supported") as err:
        load_model(str(tmp_path))
    assert "Swin" in str(err.value) and "MobileViT" in str(err.value)  # the message lists the supported families


def test_pickle_only_checkpoint_refused_unless_opted_in(tmp_path):
    folder = save_tiny("vit", tmp_path / "m")
    from safetensors.torch import load_file

    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save(weights, folder / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickle"):
        load_model(str(folder))
    loaded = load_model(str(folder), allow_pickle=True)
    assert torch.equal(loaded.base_model.embeddings.cls_token, weights["vit.embeddings.cls_token"])


def test_folder_without_weights_or_config(tmp_path):
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "vit"}))
    with pytest.raises(ModelLoadError, match="no model weights"):
        load_model(str(tmp_path))


def test_uncached_hub_id_fails_fast_with_a_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    start = time.perf_counter()
    with pytest.raises(ModelLoadError) as err:
        load_model("google/vit-base-patch16-224")
    assert time.perf_counter() - start < 5  # not the 20 s retry loop
    msg = str(err.value)
    assert "cache" in msg and "local folder" in msg and "demo" in msg


@pytest.mark.parametrize("bad", ["", "   ", "not a model!", "../../etc/passwd", "a/b/c", "https://evil.example/x"])
def test_model_names_that_do_not_parse(bad):
    with pytest.raises(ModelLoadError):
        parse_model_name(bad)


def test_names_that_parse(tmp_path):
    assert parse_model_name(" google/vit-base-patch16-224 ") == "google/vit-base-patch16-224"
    assert parse_model_name("demo") == "demo"
    assert parse_model_name(str(tmp_path)) == str(tmp_path)


def test_pick_device_falls_back_to_cpu():
    dev = pick_device()
    assert dev.type in {"cuda", "mps", "cpu"}
    if not torch.cuda.is_available():
        assert dev.type in {"mps", "cpu"}


def test_float16_on_cpu_is_refused(tiny_dirs):
    with pytest.raises(ModelLoadError, match="GPU"):
        load_model(str(tiny_dirs["vit"]), device="cpu", dtype="float16")


@pytest.mark.parametrize("key", ["vit", *HIER_KEYS])
def test_hub_id_loads_from_the_local_cache_without_network(monkeypatch, tmp_path, key):
    """A hub id that sits in the Hugging Face cache loads offline, through from_pretrained's cache lookup."""
    import shutil
    import uuid

    from huggingface_hub import constants

    repo = f"vitviz-test/tiny-{key}-{uuid.uuid4().hex[:8]}"
    root = Path(constants.HF_HUB_CACHE) / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    try:
        save_tiny(key, root / "snapshots" / commit)
        (root / "refs").mkdir(parents=True)
        (root / "refs" / "main").write_text(commit)
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # no hub: only the cache can answer
        start = time.perf_counter()
        loaded = load_model(repo)
        assert time.perf_counter() - start < 10
        assert loaded.source == repo and loaded.id2label[1] == "one"
        assert loaded.family.model_types[0] == key.replace("_registers", "")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_garbage_config_is_a_load_error(tmp_path):
    (tmp_path / "config.json").write_text("{ not json")
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(ModelLoadError, match="configuration"):
        load_model(str(tmp_path))


def test_truncated_weights_are_a_load_error(tmp_path):
    folder = save_tiny("vit", tmp_path / "m")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="weights"):
        load_model(str(folder))


def test_every_logit_has_a_name_when_the_label_table_is_shorter(tmp_path):
    from transformers import PvtConfig, PvtForImageClassification

    cfg = PvtConfig(
        image_size=32,
        depths=[1, 1, 1, 1],
        hidden_sizes=[8, 8, 16, 16],
        num_attention_heads=[1, 1, 2, 2],
        id2label={0: "zero", 1: "one"},
        label2id={"zero": 0, "one": 1},
    )
    assert cfg.num_labels == 1000  # PvT's config keeps its own count apart from id2label
    PvtForImageClassification(cfg).save_pretrained(tmp_path, safe_serialization=True)
    loaded = load_model(str(tmp_path))
    assert len(loaded.id2label) == 1000
    assert loaded.id2label[1] == "one" and loaded.id2label[340] == "class 340"
