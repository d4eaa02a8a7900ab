"""Prompt-word relevance (Chefer et al. 2021, text side) against an independent route on tiny random CLIP and SigLIP."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_zeroshot import _two_tower

from vitviz.models.prompt_relevance import prompt_relevance, token_table
from vitviz.models.zeroshot import ZeroShotError, parse_labels, text_tower

pytestmark = pytest.mark.usefixtures("one_thread")


def _reference(model, tok, kind, prompt, pixels, start_layer=0):
    """The model's own forward (output_attentions, retain_grad, backward on logits_per_image), rolled as
    MM-Explainability's notebook does; the pooled row: EOS (CLIP, eos_token_id 3) or the last position (SigLIP)."""
    model = model.requires_grad_(True)  # a private copy's parameters: the graph reaches every attention
    try:
        if kind == "clip":
            enc = tok([prompt], return_tensors="pt")
            out = model(
                input_ids=enc["input_ids"],
                attention_mask=enc["attention_mask"],
                pixel_values=pixels,
                output_attentions=True,
            )
            pooled = int((enc["input_ids"][0] == 3).nonzero()[0])
        else:
            enc = tok([prompt], padding="max_length", max_length=16, return_tensors="pt")
            out = model(input_ids=enc["input_ids"], pixel_values=pixels, output_attentions=True)
            pooled = 15
        attns = out.text_model_output.attentions
        for a in attns:
            a.retain_grad()
        out.logits_per_image[0, 0].backward()
        t = attns[0].shape[-1]
        r = torch.eye(t, dtype=torch.float64)
        start_layer = start_layer % len(attns)
        for i, a in enumerate(attns):
            if i < start_layer:
                continue
            cam = (a.grad[0].double() * a[0].detach().double()).clamp(min=0).mean(0)
            r = r + cam @ r
        real = int(enc["attention_mask"][0].sum())
        return r[pooled, :real].numpy(), tok.convert_ids_to_tokens(enc["input_ids"][0, :real].tolist())
    finally:
        model.requires_grad_(False)


@pytest.mark.parametrize("kind", ["clip", "siglip"])
def test_equals_the_reference_on_tiny_random_models(tmp_path, kind):
    import copy

    model, tok = _two_tower(tmp_path, kind)
    model.set_attn_implementation("eager")  # as load_model loads it: the attention probabilities are returned
    model.requires_grad_(False)
    reference_model = copy.deepcopy(model)
    tower = text_tower(model, str(tmp_path), {})
    labels = parse_labels("red car, dog")
    pixels = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        image = model.get_image_features(pixel_values=pixels)
        image = getattr(image, "pooler_output", image)[0].numpy()
    for start in (0, -1):
        got = prompt_relevance(model, tower, image, labels, start_block=start)
        assert [g.label for g in got] == ["red car", "dog"]
        for g in got:
            ref, tokens = _reference(reference_model, tok, kind, g.prompt, pixels, start)
            # the reference scores label 0 against the image: compare each prompt as label 0 of its own
            assert g.tokens == tuple(tokens)
            np.testing.assert_allclose(g.relevance, ref, rtol=1e-4, atol=1e-7)
    clip = kind == "clip"
    first = got[0]
    assert first.tokens[:3] == ("<bos>", "a", "photo") and first.tokens[-1] == "<eos>"
    assert first.pooled == (len(first.tokens) - 1 if clip else None)  # SigLIP pools a padding position
    tokens, rel = token_table(got)
    assert tokens.shape == rel.shape == (2, len(first.tokens))
    assert tokens[1, -1] == "" and np.isnan(rel[1, -1]) and tokens.dtype.kind == "U"
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ZeroShotError, match=r"0\.\.1"):
        prompt_relevance(model, tower, image, labels, start_block=2)
