"""Zero-shot labels: parsing what users type, and scores equal to the models' own logits_per_image."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitviz.errors import ModelLoadError
from vitviz.models.zeroshot import (
    DEFAULT_TEMPLATE,
    MAX_LABEL_CHARS,
    MAX_LABELS,
    ZeroShotError,
    encode_labels,
    parse_labels,
    score,
    text_tower,
)

WORDS = ["a", "photo", "of", "cat", "dog", "car", "red", "star", "the", ".", "{", "}"]


def test_labels_by_line_or_comma_trimmed_and_unique():
    assert parse_labels("cat, dog ,car").names == ("cat", "dog", "car")
    multi = parse_labels("a red car\n\n  big  dog \na red car")
    assert multi.names == ("a red car", "big dog")
    assert any("twice" in n for n in multi.notes)
    assert parse_labels("cat, dog").prompts == ("a photo of a cat.", "a photo of a dog.")
    assert parse_labels("cat", "{}").prompts == ("cat",)
    assert parse_labels("cat", "").prompts == ("cat",)  # an empty template means the labels as they are


@pytest.mark.parametrize("text", ["", "   ", ",,,", "\n\n"])
def test_no_labels_is_a_clear_message(text):
    with pytest.raises(ZeroShotError, match="at least one label"):
        parse_labels(text)


def test_many_long_and_unicode_labels_are_cut_with_a_note():
    many = parse_labels(",".join(f"thing {i}" for i in range(200)))
    assert len(many.names) == MAX_LABELS and any("200 labels" in n for n in many.notes)
    long = parse_labels("x" * 10_000)
    assert len(long.names[0]) == MAX_LABEL_CHARS and any("cut" in n for n in long.notes)
    uni = parse_labels("猫, собака, 🚗, café")
    assert uni.names == ("猫", "собака", "🚗", "café")


def test_templates_need_a_slot_and_other_braces_are_kept():
    with pytest.raises(ZeroShotError, match="needs \\{\\}"):
        parse_labels("cat", "a photo")
    assert parse_labels("cat", "a {} in {braces}").prompts == ("a cat in {braces}",)
    assert DEFAULT_TEMPLATE == "a photo of a {}."


def _two_tower(folder, kind: str):
    from transformers import CLIPConfig, CLIPModel, SiglipConfig, SiglipModel

    from vitviz.demo.tokenizer import word_tokenizer

    torch.manual_seed(0)
    tok = word_tokenizer(WORDS)
    text = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=16,
        eos_token_id=3,
        pad_token_id=0,
        bos_token_id=2,
    )
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8
    )
    if kind == "clip":
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    else:
        model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
    with torch.no_grad():
        model.logit_scale.fill_(2.0)
        if hasattr(model, "logit_bias"):
            model.logit_bias.fill_(-1.5)
    model.eval().save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return model, tok


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_scores_equal_the_models_own_logits(tmp_path, kind):
    model, tok = _two_tower(tmp_path, kind)
    tower = text_tower(model, str(tmp_path), {})
    assert tower.rule == ("softmax" if kind == "clip" else "sigmoid")
    labels = parse_labels("cat, red car, a dog")
    text = encode_labels(model, tower, labels)
    pixels = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        image = model.get_image_features(pixel_values=pixels)
        image = getattr(image, "pooler_output", image)[0].numpy()
        ids = tok(list(labels.prompts), padding=tower.padding, max_length=tower.max_length, return_tensors="pt")
        own = model(
            input_ids=ids["input_ids"],
            pixel_values=pixels,
            **({"attention_mask": ids["attention_mask"]} if kind == "clip" else {}),
        ).logits_per_image[0]
    got = score(model, tower, image, text)
    np.testing.assert_allclose(got.logits, own.numpy(), rtol=1e-5, atol=1e-5)
    if kind == "clip":
        np.testing.assert_allclose(got.probabilities, torch.softmax(own, 0).numpy(), rtol=1e-5)
        assert got.probabilities.sum() == pytest.approx(1.0)
    else:
        np.testing.assert_allclose(got.probabilities, torch.sigmoid(own).numpy(), rtol=1e-5)


def test_a_checkpoint_missing_a_projection_is_named(tmp_path):
    model, _ = _two_tower(tmp_path, "clip")
    with pytest.raises(ModelLoadError, match=r"text_projection\.weight"):
        text_tower(model, str(tmp_path), {}, missing_keys=["text_projection.weight"])


def test_a_model_without_a_text_tower_has_none(tmp_path):
    from transformers import CLIPVisionConfig, CLIPVisionModel

    model = CLIPVisionModel(
        CLIPVisionConfig(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=16,
            patch_size=8,
        )
    )
    assert text_tower(model, str(tmp_path), {}) is None


def test_a_declared_template_is_the_default(tmp_path):
    model, _ = _two_tower(tmp_path, "clip")
    (tmp_path / "vitviz.json").write_text('{"prompt_template": "a {} on a background."}')
    assert text_tower(model, str(tmp_path), {}).template == "a {} on a background."


def test_towers_of_different_widths_are_refused(tmp_path):
    from transformers import SiglipConfig, SiglipModel

    text = dict(
        vocab_size=16,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=8,
    )
    vision = dict(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, image_size=16, patch_size=8
    )
    model = SiglipModel(SiglipConfig(text_config=text, vision_config=vision))
    with pytest.raises(ModelLoadError, match="16-d embeddings and the image tower 32-d"):
        text_tower(model, str(tmp_path), {})


def test_repeats_give_one_note_not_one_per_repeat():
    """Issue 23.14: 10,000 copies of one label gave 9,999 captions."""
    labels = parse_labels("\n".join(["cat"] * 2000 + ["dog"] * 3 + ["car"]))
    assert labels.names == ("cat", "dog", "car")
    assert labels.notes == ("Repeated labels are scored once: 'cat' 2,000 times, 'dog' 3 times.",)


def test_label_text_is_capped_with_a_note_and_parsed_in_one_pass():
    """Issue 23.2: 60,000 labels took 12.7 s (a list search per label); the text is capped and parsed linearly."""
    from vitviz.models.zeroshot import MAX_LABELS_TEXT

    text = "\n".join(f"label {i}" for i in range(60_000))
    labels = parse_labels(text)
    assert labels.names == tuple(f"label {i}" for i in range(MAX_LABELS))
    read = text[:MAX_LABELS_TEXT]
    whole = read[: read.rfind("\n")].count("\n") + 1  # labels wholly inside the part read
    assert labels.notes == (
        f"The labels text is {len(text):,} characters long; only the first {MAX_LABELS_TEXT:,} were read.",
        f"{whole} labels were given; the first {MAX_LABELS} are scored.",
    )
    commas = parse_labels(",".join(["x"] * 20_000))  # one line: cut at the last comma, one repeat note
    assert commas.names == ("x",) and len(commas.notes) == 2


def test_notes_stay_few_however_many_labels_are_cut():
    labels = parse_labels("\n".join([f"{i} " + "y" * 200 for i in range(40)]))
    assert len(labels.notes) == 8 and labels.notes[-1] == "33 more notes like these."


def test_the_command_line_caps_labels_and_says_so(tmp_path, capsys):
    """Issue 23.2, CLI: `export --labels` goes through the same caps, each with a note on stderr."""
    from PIL import Image

    from vitviz.__main__ import main

    image = tmp_path / "img.png"
    Image.new("RGB", (40, 30), (200, 30, 30)).save(image)
    labels = ",".join(["star", "red"] * 2000)  # 17,999 characters, 2 distinct labels (words the demo knows)
    assert main(["export", "--model", "demo-clip", "--out", str(tmp_path / "out"), "--labels", labels, str(image)]) == 0
    err = capsys.readouterr().err
    assert "note: The labels text is 17,999 characters long; only the first 10,000 were read." in err
    # "star,red," is 9 characters: 1,111 pairs fill 9,999 of the 10,000, the last comma closes the last whole label
    assert "note: Repeated labels are scored once: 'star' 1,111 times, 'red' 1,111 times." in err
    with np.load(tmp_path / "out" / "img.npz", allow_pickle=False) as z:
        assert z["label_probabilities"].shape == (2,)


def test_words_the_tokenizer_does_not_know_are_named():
    from vitviz.models.load import load_model
    from vitviz.models.zeroshot import unknown_words, vocabulary_warning

    loaded = load_model("demo-clip")
    labels = parse_labels("cat, dog, circle, red star", loaded.text.template)
    # independent reference: the demo's vocabulary is vitviz.demo.clip.WORDS; "cat" and "dog" are not in it
    from vitviz.demo.clip import WORDS

    assert "cat" not in WORDS and "circle" in WORDS and "red" in WORDS
    assert unknown_words(loaded.text, labels) == {"cat": ("cat",), "dog": ("dog",)}
    msg = vocabulary_warning(loaded.text, labels, "demo-clip")
    assert "'cat', 'dog':" in msg and "'circle'" not in msg
    assert vocabulary_warning(loaded.text, parse_labels("circle, star", loaded.text.template), "demo-clip") == ""
    # unknown words of the template are named too (not only the label's)
    odd = parse_labels("circle", "a sketch of a {}.")
    assert unknown_words(loaded.text, odd) == {"circle": ("sketch",)}
    # the same id for two labels is what made the scores equal: the warning is the only signal
    ids = [loaded.text.tokenizer(p)["input_ids"] for p in labels.prompts[:2]]
    assert ids[0] == ids[1]


def test_a_tokenizer_without_an_unknown_token_warns_of_nothing(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from vitviz.models.zeroshot import TextTower, unknown_words, vocabulary_warning

    raw = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz .")}, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw)
    assert tok.unk_token_id is None
    tower = TextTower(tok, "longest", 16, "softmax", "{}")
    labels = parse_labels("cat, zebra")
    assert unknown_words(tower, labels) == {}
    assert vocabulary_warning(tower, labels, "bpe") == ""


def test_a_two_tower_folder_without_a_tokenizer_says_so(tmp_path):
    from vitviz.models.load import load_model
    from vitviz.models.zeroshot import text_tower_note

    model, _ = _two_tower(tmp_path, "siglip")
    for f in tmp_path.iterdir():
        if "token" in f.name or f.name in ("vocab.json", "special_tokens_map.json"):
            f.unlink()
    assert text_tower(model, str(tmp_path), {}) is None
    note = text_tower_note(model, "folder")
    assert "tokenizer" in note and "zero-shot" in note and "backbone" not in note
    from transformers import SiglipImageProcessor

    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    assert not loaded.zero_shot and "tokenizer" in loaded.text_note
    from vitviz.methods import why_unavailable

    why = why_unavailable(loaded, "relevance")
    assert "tokenizer" in why and "backbone without" not in why


def test_siglip_label_embeddings_equal_get_text_features(tmp_path):
    """encode_labels runs SigLIP's last text block for the pooled token only: the same numbers as the model's own."""
    from vitviz.models.zeroshot import _pools_last

    model, tok = _two_tower(tmp_path, "siglip")
    model.set_attn_implementation("eager")
    tower = text_tower(model, str(tmp_path), {})
    assert _pools_last(model)
    labels = parse_labels("cat, red car, a dog, star")
    got = encode_labels(model, tower, labels, chunk=3)
    ids = tok(list(labels.prompts), padding="max_length", max_length=16, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        own = model.get_text_features(input_ids=ids)
        own = getattr(own, "pooler_output", own).numpy()
    np.testing.assert_allclose(got, own, rtol=1e-5, atol=1e-6)


def test_the_runs_label_scorer_gives_the_models_own_logits(tmp_path):
    """The one scorer of label targets (``scorer_for``, the Run's) is the model's ``logits_per_image``; the
    classifier proxy it replaced (``LabelScores``, ``as_classifier``) is gone."""
    from vitviz.capture.forward import forward_output, input_size_for, preprocess
    from vitviz.capture.targets import NoScores, scorer_for
    from vitviz.models import zeroshot
    from vitviz.models.load import load_model

    _two_tower(tmp_path, "siglip")
    from transformers import SiglipImageProcessor

    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path))
    labels = parse_labels("cat, red car, a dog")
    from PIL import Image

    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    hw = input_size_for(loaded, None, image.size)
    pixels, _ = preprocess(loaded, [image], hw)
    ids = loaded.text.tokenizer(list(labels.prompts), padding="max_length", max_length=16, return_tensors="pt")
    with torch.no_grad():
        own = loaded.model(input_ids=ids["input_ids"], pixel_values=pixels).logits_per_image[0].numpy()
        got = scorer_for(loaded, labels)(forward_output(loaded, pixels, hw))[0].numpy()
    np.testing.assert_allclose(got, own, rtol=1e-4, atol=1e-4)
    assert not hasattr(zeroshot, "LabelScores") and not hasattr(zeroshot, "as_classifier")
    assert "LabelScores" not in zeroshot.__all__ and "as_classifier" not in zeroshot.__all__
    with pytest.raises(NoScores):
        scorer_for(load_model("demo"), labels)
