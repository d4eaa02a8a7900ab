"""Shared fixtures: tiny random-weight models of every supported family, saved to folders.

Nothing here downloads: each model is built from a config and written with
``save_pretrained`` (safetensors) into a temporary folder, then loaded back
through vitviz's real loading code.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # belt and braces: tests never touch the network
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def pytest_collection_modifyitems(config, items):
    """The tiers (tests/tiers.py): ``browser`` and ``slow`` marks, so ``-m "not slow and not browser"`` is fast."""
    from tiers import tier_marks

    for item in items:
        browser, slow = tier_marks(item)
        if browser:
            item.add_marker(pytest.mark.browser)
        if slow:
            item.add_marker(pytest.mark.slow)


TINY = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32, patch_size=8
)


def _configs():
    from transformers import (
        BeitConfig,
        DeiTConfig,
        Dinov2Config,
        Dinov2WithRegistersConfig,
        ViTConfig,
    )

    labels = {"id2label": {0: "zero", 1: "one", 2: "two"}, "label2id": {"zero": 0, "one": 1, "two": 2}}
    return {
        "vit": ("ViTForImageClassification", ViTConfig(**TINY, **labels)),
        "deit": ("DeiTForImageClassificationWithTeacher", DeiTConfig(**TINY, **labels)),
        "dino": ("ViTModel", ViTConfig(**TINY)),
        "dinov2": ("Dinov2Model", Dinov2Config(**{**TINY, "patch_size": 4})),
        "dinov2_registers": (
            "Dinov2WithRegistersModel",
            Dinov2WithRegistersConfig(**{**TINY, "patch_size": 4}, num_register_tokens=4),
        ),
        "beit": ("BeitForImageClassification", BeitConfig(**TINY, **labels)),
    }


FAMILY_KEYS = ("vit", "deit", "dino", "dinov2", "dinov2_registers", "beit")
EXPECTED_PREFIX = {
    "vit": ("CLS",),
    "deit": ("CLS", "DIST"),
    "dino": ("CLS",),
    "dinov2": ("CLS",),
    "dinov2_registers": ("CLS", "REG0", "REG1", "REG2", "REG3"),
    "beit": ("CLS",),
}


def _hier_configs():
    """Tiny hierarchical models: (architecture, config, input side in px)."""
    from transformers import (
        CvtConfig,
        HieraConfig,
        MobileViTConfig,
        MobileViTV2Config,
        PvtConfig,
        PvtV2Config,
        SwinConfig,
        Swinv2Config,
    )

    labels = {"id2label": {0: "zero", 1: "one", 2: "two"}, "label2id": {"zero": 0, "one": 1, "two": 2}}
    swin = dict(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4)
    pyramid = dict(hidden_sizes=[16, 16, 32, 32], num_attention_heads=[1, 1, 2, 2], mlp_ratios=[2, 2, 2, 2])
    return {
        "swin": ("SwinForImageClassification", SwinConfig(**swin, **labels), 64),
        "swinv2": ("Swinv2ForImageClassification", Swinv2Config(**swin, **labels), 64),
        "cvt": (
            "CvtForImageClassification",
            CvtConfig(depth=[1, 2, 3], embed_dim=[16, 32, 48], num_heads=[1, 2, 3], **labels),
            64,
        ),
        "pvt": ("PvtForImageClassification", PvtConfig(image_size=64, depths=[1, 1, 1, 1], **pyramid, **labels), 64),
        "pvt_v2": (
            "PvtV2ForImageClassification",
            PvtV2Config(image_size=64, depths=[1, 1, 1, 1], sr_ratios=[4, 2, 2, 1], **pyramid, **labels),
            64,
        ),
        "mobilevit": (
            "MobileViTForImageClassification",
            MobileViTConfig(
                image_size=128,
                hidden_sizes=[16, 24, 32],
                neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
                num_attention_heads=2,
                expand_ratio=2.0,
                **labels,
            ),
            128,
        ),
        "mobilevitv2": (
            "MobileViTV2ForImageClassification",
            MobileViTV2Config(image_size=128, width_multiplier=0.125, n_attn_blocks=[1, 2, 1], **labels),
            128,
        ),
        # 16 x 16 tokens in 2 x 2 mask units of 8 x 8; stages 1-2 in mask units (stage 3's first block too, lagged),
        # stage 4 global; every later stage starts with a query-pooling block.
        "hiera": (
            "HieraForImageClassification",
            HieraConfig(image_size=[64, 64], embed_dim=8, depths=[1, 2, 2, 2], num_heads=[1, 2, 2, 4], **labels),
            64,
        ),
    }


HIER_KEYS = ("swin", "swinv2", "cvt", "pvt", "pvt_v2", "mobilevit", "mobilevitv2", "hiera")


def _liven(model: torch.nn.Module) -> None:
    """Logits that depend on the image for a tiny random MobileViT.

    ``transformers`` initialises BatchNorm weights and convolutions with std 0.02, so a
    tiny random MobileViT's activations underflow to zero before the classifier and every
    gradient vanishes: BatchNorm weights of 1 and He-scaled weights instead.
    """
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.weight.fill_(1.0)
            if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
                mod.weight.mul_((2.0 / mod.weight[0].numel()) ** 0.5 / mod.weight.std())


def save_tiny(key: str, folder: Path, *, seed: int = 0) -> Path:
    import transformers
    from transformers import ViTImageProcessor

    arch, config, side = {**{k: (*v, 32) for k, v in _configs().items()}, **_hier_configs()}[key]
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config)
    if key.startswith("mobilevit"):
        _liven(model)
    model.save_pretrained(folder, safe_serialization=True)
    ViTImageProcessor(size={"height": side, "width": side}, image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(
        folder
    )
    return folder


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return {k: save_tiny(k, root / k) for k in FAMILY_KEYS}


@pytest.fixture(scope="session")
def hier_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-hierarchical")
    return {k: save_tiny(k, root / k) for k in HIER_KEYS}


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs):
    from vitviz.models.load import load_model

    return {k: load_model(str(d), device="cpu") for k, d in tiny_dirs.items()}


@pytest.fixture(scope="session")
def demo_model():
    from vitviz.models.load import load_model

    return load_model("demo", device="cpu")


def random_image(seed: int = 0, size: tuple[int, int] = (40, 48)) -> Image.Image:
    """A noisy RGB image (w, h) = size."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB")


def random_attention(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """Row-stochastic random attention of ``shape`` (..., T, T), float64."""
    rng = np.random.default_rng(seed)
    a = rng.random(shape) ** 3
    return a / a.sum(axis=-1, keepdims=True)


MODERN_KEYS = ("clip", "siglip", "siglip2", "dinov3")
ZS_WORDS = ["a", "photo", "of", "cat", "dog", "car", "red", "star", "circle", "square", "bird", "airplane", "."]


def save_modern(key: str, folder: Path, *, seed: int = 0) -> Path:
    """Tiny two-tower models with an offline word-level tokenizer (zero-shot), and a DINOv3 with registers."""
    import transformers as tf

    from vitviz.demo.tokenizer import word_tokenizer

    torch.manual_seed(seed)
    tok = word_tokenizer(ZS_WORDS)
    text = dict(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        eos_token_id=3,
        pad_token_id=0,
        bos_token_id=2,
    )
    vision = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    if key == "clip":
        model = tf.CLIPModel(
            tf.CLIPConfig(
                text_config=text, vision_config={**vision, "image_size": 32, "patch_size": 8}, projection_dim=24
            )
        )
        proc = tf.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    elif key == "siglip":
        model = tf.SiglipModel(
            tf.SiglipConfig(text_config=text, vision_config={**vision, "image_size": 32, "patch_size": 8})
        )
        proc = tf.SiglipImageProcessorPil(size={"height": 32, "width": 32})
    elif key == "siglip2":
        model = tf.Siglip2Model(
            tf.Siglip2Config(text_config=text, vision_config={**vision, "patch_size": 4, "num_patches": 64})
        )
        proc = tf.Siglip2ImageProcessorPil(patch_size=4, max_num_patches=64)
    else:
        model = tf.DINOv3ViTModel(
            tf.DINOv3ViTConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                image_size=32,
                patch_size=8,
                num_register_tokens=2,
            )
        )
        proc = tf.ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    model.save_pretrained(folder, safe_serialization=True)
    proc.save_pretrained(folder)
    if key != "dinov3":
        tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def modern_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny-modern")
    return {k: save_modern(k, root / k) for k in MODERN_KEYS}


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread while a module runs: on a busy 2-core machine OpenMP teams of tiny ops spend their time
    waiting (several times slower), and no result changes. Modules ask for it with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def local_ray():
    """One local 2-CPU Ray for the whole session: started by the first test that asks for it, shut down at the
    session's end (a Ray already running, e.g. started by the caller, is used and left running). Ray's start-up is
    paid once however many Ray modules run. The actors use one torch thread each: modules that compare with the
    local engine ask for ``one_thread`` too."""
    ray = pytest.importorskip("ray")
    from vitviz.evaluate.ray_engine import start_local_ray

    started = not ray.is_initialized()
    if started:
        start_local_ray(num_cpus=2)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


class Counter:
    """Counts calls through the model's own top-level forward."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.n += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.remove()


FRACTIONS = np.linspace(0, 1, 21)  # the fractions of patches a stand-in's curves are given at


def scored_stand_in(
    d: float, i: float, *, class_index: int = 2, label: str = "two", peak: bool | None = None
) -> object:
    """Stands in for an ``evaluate`` ``Faithfulness``: the attributes ``make_rows`` reads, flat curves at the
    deletion area ``d`` and the insertion area ``i``."""
    from types import SimpleNamespace

    return SimpleNamespace(
        class_index=class_index,
        label=label,
        probability=0.9,
        deletion_area=d,
        insertion_area=i,
        peak_in_box=peak,
        fractions=FRACTIONS,
        deletion=np.full(21, d),
        insertion=np.full(21, i),
    )
