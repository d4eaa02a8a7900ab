"""``convert --arch open_clip``: a tiny open_clip folder (config, weights in open_clip's key layout, CLIP BPE files),
written here, becomes an HF CLIP folder whose zero-shot logits equal open_clip's formula, computed independently."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitviz.__main__ import main
from vitviz.zoo.open_clip import convert_open_clip

pytestmark = pytest.mark.usefixtures("one_thread")

CFG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "patch_size": 8, "head_width": 8},
    "text_cfg": {"context_length": 32, "vocab_size": 514, "width": 24, "heads": 4, "layers": 2},
}


def _bytes_to_unicode() -> list[str]:
    """CLIP's byte-level alphabet (OpenAI's bytes_to_unicode)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def _open_clip_state(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape, s=0.2):
        return torch.randn(*shape, generator=g) * s

    v, t, e = cfg["vision_cfg"], cfg["text_cfg"], cfg["embed_dim"]
    sd: dict[str, torch.Tensor] = {}

    def blocks(prefix: str, n: int, w: int) -> None:
        for i in range(n):
            p = f"{prefix}.{i}"
            sd.update(
                {
                    f"{p}.ln_1.weight": 1 + r(w),
                    f"{p}.ln_1.bias": r(w),
                    f"{p}.ln_2.weight": 1 + r(w),
                    f"{p}.ln_2.bias": r(w),
                    f"{p}.attn.in_proj_weight": r(3 * w, w),
                    f"{p}.attn.in_proj_bias": r(3 * w),
                    f"{p}.attn.out_proj.weight": r(w, w),
                    f"{p}.attn.out_proj.bias": r(w),
                    f"{p}.mlp.c_fc.weight": r(4 * w, w),
                    f"{p}.mlp.c_fc.bias": r(4 * w),
                    f"{p}.mlp.c_proj.weight": r(w, 4 * w),
                    f"{p}.mlp.c_proj.bias": r(w),
                }
            )

    w, grid = v["width"], v["image_size"] // v["patch_size"]
    sd.update(
        {
            "visual.class_embedding": r(w),
            "visual.positional_embedding": r(grid * grid + 1, w),
            "visual.conv1.weight": r(w, 3, v["patch_size"], v["patch_size"]),
            "visual.ln_pre.weight": 1 + r(w),
            "visual.ln_pre.bias": r(w),
            "visual.ln_post.weight": 1 + r(w),
            "visual.ln_post.bias": r(w),
            "visual.proj": r(w, e),
        }
    )
    blocks("visual.transformer.resblocks", v["layers"], w)
    tw = t["width"]
    sd.update(
        {
            "token_embedding.weight": r(t["vocab_size"], tw),
            "positional_embedding": r(t["context_length"], tw),
            "ln_final.weight": 1 + r(tw),
            "ln_final.bias": r(tw),
            "text_projection": r(tw, e),
            "logit_scale": torch.tensor(np.log(1 / 0.07), dtype=torch.float32),
        }
    )
    blocks("transformer.resblocks", t["layers"], tw)
    return sd


def _resblocks(sd, prefix, n, x, heads, mask, act):
    """open_clip's ResidualAttentionBlock: x + attn(ln_1(x)); x + mlp(ln_2(x)), attention by nn.MultiheadAttention."""
    w = x.shape[-1]
    for i in range(n):
        p = f"{prefix}.{i}"
        mha = torch.nn.MultiheadAttention(w, heads, batch_first=True)
        mha.load_state_dict({k[len(f"{p}.attn.") :]: v for k, v in sd.items() if k.startswith(f"{p}.attn.")})
        h = F.layer_norm(x, (w,), sd[f"{p}.ln_1.weight"], sd[f"{p}.ln_1.bias"], 1e-5)
        x = x + mha(h, h, h, need_weights=False, attn_mask=mask)[0]
        h = F.layer_norm(x, (w,), sd[f"{p}.ln_2.weight"], sd[f"{p}.ln_2.bias"], 1e-5)
        h = F.linear(
            act(F.linear(h, sd[f"{p}.mlp.c_fc.weight"], sd[f"{p}.mlp.c_fc.bias"])),
            sd[f"{p}.mlp.c_proj.weight"],
            sd[f"{p}.mlp.c_proj.bias"],
        )
        x = x + h
    return x


@torch.no_grad()
def _open_clip_logits(sd, cfg, pixels, ids):
    """open_clip's CLIP.forward: encode_image, encode_text (causal mask, argmax pooling), scale * cos."""
    v, t = cfg["vision_cfg"], cfg["text_cfg"]
    act = F.gelu
    x = F.conv2d(pixels, sd["visual.conv1.weight"], stride=v["patch_size"]).flatten(2).transpose(1, 2)
    cls = sd["visual.class_embedding"].expand(x.shape[0], 1, -1)
    x = torch.cat([cls, x], 1) + sd["visual.positional_embedding"]
    w = v["width"]
    x = F.layer_norm(x, (w,), sd["visual.ln_pre.weight"], sd["visual.ln_pre.bias"], 1e-5)
    x = _resblocks(sd, "visual.transformer.resblocks", v["layers"], x, w // v["head_width"], None, act)
    img = F.layer_norm(x[:, 0], (w,), sd["visual.ln_post.weight"], sd["visual.ln_post.bias"], 1e-5) @ sd["visual.proj"]
    n = ids.shape[1]
    mask = torch.full((n, n), float("-inf")).triu(1)
    tw = t["width"]
    y = sd["token_embedding.weight"][ids] + sd["positional_embedding"][:n]
    y = _resblocks(sd, "transformer.resblocks", t["layers"], y, t["heads"], mask, act)
    y = F.layer_norm(y, (tw,), sd["ln_final.weight"], sd["ln_final.bias"], 1e-5)
    txt = y[torch.arange(y.shape[0]), ids.argmax(-1)] @ sd["text_projection"]
    img, txt = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
    return (sd["logit_scale"].exp() * img @ txt.T).numpy()


def _folder(tmp_path, cfg=CFG, *, state=None, tokenizer=True, bin_file=False):
    folder = tmp_path / "oc"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(
        json.dumps({"model_cfg": cfg, "preprocess_cfg": {"mean": [0.5] * 3, "std": [0.5] * 3}})
    )
    state = _open_clip_state(cfg) if state is None else state
    if bin_file:
        torch.save(state, folder / "open_clip_pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "open_clip_model.safetensors"))
    if tokenizer:  # CLIP's BPE with no merges: 256 bytes, 256 word ends, <|startoftext|>, <|endoftext|> (the highest)
        alphabet = _bytes_to_unicode()
        vocab = alphabet + [a + "</w>" for a in alphabet] + ["<|startoftext|>", "<|endoftext|>"]
        (folder / "vocab.json").write_text(json.dumps({tok: i for i, tok in enumerate(vocab)}))
        (folder / "merges.txt").write_text("#version: 0.2\n")
    return folder, state


@pytest.mark.parametrize("bin_file", [False, True])
def test_zero_shot_logits_equal_open_clips_formula(tmp_path, bin_file):
    from vitviz.capture.forward import capture
    from vitviz.models.load import load_model
    from vitviz.models.zeroshot import encode_labels, parse_labels, score

    folder, state = _folder(tmp_path, bin_file=bin_file)
    report = convert_open_clip(folder, tmp_path / "hf")
    assert report.notes == []
    loaded = load_model(str(tmp_path / "hf"))
    assert loaded.zero_shot and loaded.family.name == "CLIP"
    labels = parse_labels("cat, dog, red car", "a photo of a {}.")
    tok = loaded.text.tokenizer
    rows = [tok(p)["input_ids"] for p in labels.prompts]  # open_clip's tokenize: ids, then zeros to the context
    assert all(tok.convert_ids_to_tokens([r[-1]]) == ["<|endoftext|>"] and r[-1] == max(r) for r in rows)
    ids = torch.zeros(len(rows), 32, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
    from PIL import Image

    rng = np.random.default_rng(0)
    image = Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
    cap = capture(loaded, image)
    from vitviz.capture.forward import input_size_for, preprocess

    pixels, _ = preprocess(loaded, [image], input_size_for(loaded, None, image.size))
    ref = _open_clip_logits(state, CFG, pixels, ids)[0]
    got = score(loaded.model, loaded.text, cap.image_embedding, encode_labels(loaded.model, loaded.text, labels))
    np.testing.assert_allclose(got.logits, ref, rtol=1e-4, atol=1e-4)
    assert np.ptp(ref) > 1e-3  # the labels really differ


def test_a_folder_without_tokenizer_converts_with_a_note(tmp_path, capsys):
    folder, _ = _folder(tmp_path, tokenizer=False)
    assert main(["convert", "--arch", "open_clip", "--checkpoint", str(folder), "--out", str(tmp_path / "hf")]) == 0
    err = capsys.readouterr().err
    assert "no tokenizer files" in err and (tmp_path / "hf" / "model.safetensors").is_file()


def _refused(tmp_path, capsys, folder, match):
    out = tmp_path / "hf"
    assert main(["convert", "--arch", "open_clip", "--checkpoint", str(folder), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err, err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".hf-")]


def test_unmappable_towers_are_refused(tmp_path, capsys):
    convnext = {**CFG, "vision_cfg": {"timm_model_name": "convnext_base", "image_size": 32}}
    folder, _ = _folder(tmp_path, convnext, state=_open_clip_state(CFG))
    _refused(tmp_path, capsys, folder, "timm image tower (e.g. ConvNeXt)")


def test_weights_that_do_not_fit_are_refused(tmp_path, capsys):
    state = _open_clip_state(CFG)
    state["visual.proj"] = torch.zeros(32, 8)  # another embedding width
    folder, _ = _folder(tmp_path, state=state)
    _refused(tmp_path, capsys, folder, "does not fit")


def test_extra_keys_are_refused(tmp_path, capsys):
    state = {**_open_clip_state(CFG), "visual.transformer.resblocks.0.ls_1.gamma": torch.ones(32)}
    folder, _ = _folder(tmp_path, state=state)
    _refused(tmp_path, capsys, folder, "keys it does not describe")


class Payload:
    def __reduce__(self):
        return (print, ("code ran",))


def test_a_pickle_carrying_code_is_refused(tmp_path, capsys):
    folder, _ = _folder(tmp_path, bin_file=True)
    torch.save({"state_dict": Payload()}, folder / "open_clip_pytorch_model.bin")
    _refused(tmp_path, capsys, folder, "is not a plain state dict that can be read safely")
    assert "code ran" not in capsys.readouterr().out


# -- issue 33.11: configs that are not open_clip configs get a message, never a traceback -----------------------


def _with(section: str, **changes):
    cfg = json.loads(json.dumps(CFG))
    (cfg if section == "model" else cfg[section]).update(changes)
    return cfg


@pytest.mark.parametrize(
    "cfg,words",
    [
        (_with("vision_cfg", head_width=0), "vision_cfg.head_width = 0"),
        (_with("vision_cfg", layers="twelve"), "vision_cfg.layers = 'twelve'"),
        (_with("vision_cfg", mlp_ratio="inf"), "vision_cfg.mlp_ratio = 'inf'"),
        (_with("text_cfg", mlp_ratio=float("nan")), "text_cfg.mlp_ratio"),
        (_with("vision_cfg", width=True), "vision_cfg.width = True"),
        (_with("vision_cfg", width=33, head_width=8), "vision_cfg.width 33 is not a multiple of its head_width 8"),
        (_with("text_cfg", heads=5), "text_cfg.width 24 is not a multiple of its heads 5"),
        (_with("model", vision_cfg=[1, 2]), "vision_cfg must be a table"),
        (_with("model", embed_dim=-3), "embed_dim = -3"),
        (_with("text_cfg", vocab_size=400_000_000), "text_cfg.vocab_size = 400,000,000"),
        (_with("vision_cfg", width=32768), "vision_cfg.width = 32,768"),
        (_with("vision_cfg", layers=10**6), "vision_cfg.layers = 1,000,000"),
    ],
    ids=[
        "head_width-0",
        "layers-text",
        "mlp-inf",
        "mlp-nan",
        "width-bool",
        "width-heads",
        "text-heads",
        "vision-list",
        "embed-negative",
        "vocab-400M",
        "width-32768",
        "layers-million",
    ],
)
def test_config_values_of_the_wrong_type_or_range_are_refused(tmp_path, capsys, cfg, words):
    folder, _ = _folder(tmp_path, cfg, state=_open_clip_state(CFG))
    _refused(tmp_path, capsys, folder, words)


def test_a_deeply_nested_or_huge_config_is_refused(tmp_path, capsys):
    folder, _ = _folder(tmp_path)
    config = folder / "open_clip_config.json"
    config.write_text('{"model_cfg": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _refused(tmp_path, capsys, folder, "nested too deeply")
    with config.open("w") as fh:  # 180 MB were read and accepted
        fh.write('{"model_cfg": ' + json.dumps(CFG) + ', "notes": "')
        fh.write("x" * (2 * 2**20))
        fh.write('"}')
    _refused(tmp_path, capsys, folder, "larger than 1 MB")


# -- issue 33.7: a tiny folder whose config is huge is refused before anything of that size is allocated ----


ALLOCATES = textwrap.dedent(
    """
    import json, resource, sys
    from vitviz.__main__ import main
    from vitviz.zoo.open_clip import convert_open_clip  # imports torch and transformers first
    import transformers  # noqa
    from transformers import CLIPModel  # noqa
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = main(["convert", "--arch", "open_clip", "--checkpoint", sys.argv[1], "--out", sys.argv[2]])
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"code": code, "grew_kb": after - before}))
    """
)


def test_a_wide_config_beside_small_weights_is_refused_without_building_it(tmp_path):
    """Width 4096 beside weights of width 32: convert built a 1.1 GB model from a 45 KB folder before comparing."""
    import subprocess
    import sys

    cfg = _with("vision_cfg", width=4096, head_width=64, layers=2)
    folder, _ = _folder(tmp_path, cfg, state=_open_clip_state(CFG))
    assert sum(f.stat().st_size for f in folder.iterdir()) < 400_000  # weights, config and tokenizer files
    proc = subprocess.run(
        [sys.executable, "-c", ALLOCATES, str(folder), str(tmp_path / "hf")],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["code"] == 1 and "does not fit" in proc.stderr, proc.stderr
    assert result["grew_kb"] < 300 * 1024, result  # building it took about 1.1 GB
    assert not (tmp_path / "hf").exists()
