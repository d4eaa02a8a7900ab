"""Issue 23 items 17-19: convert checks archives, reads training settings as data, and checks head sizes."""

from __future__ import annotations

import json

import pytest
from cli_tools import _cli, _one_line_error

# -- 17, 18, 19. convert: damaged files, training settings beside the weights, heads of the wrong size ---


def _cct_state(num_labels: int) -> dict:
    import torch

    from vitviz.zoo.cct import CONVERTERS, CctForImageClassification

    torch.manual_seed(0)
    return CctForImageClassification(CONVERTERS["cct_7_3x1_32"].config(num_labels=num_labels)).state_dict()


@pytest.fixture(scope="module")
def cct10() -> dict:
    return _cct_state(10)


def test_convert_refuses_a_torch_archive_with_one_flipped_byte(tmp_path, cct10):
    import torch

    from vitviz.zoo.convert import ConvertError, read_state_dict

    path = tmp_path / "ck.pth"
    torch.save({"model": cct10}, path)
    raw = bytearray(path.read_bytes())
    key = "classifier.fc.weight"
    needle = cct10[key].numpy().tobytes()[:64]
    at = bytes(raw).index(needle)  # the first bytes of that tensor's data inside the archive
    raw[at + 5] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(ConvertError, match=r"damaged: the checksum \(CRC\) of .* does not match"):
        read_state_dict(path)


def _safetensors_bytes(header: dict, data: bytes) -> bytes:
    head = json.dumps(header).encode()
    return len(head).to_bytes(8, "little") + head + data


@pytest.mark.parametrize(
    "header,data,words",
    [
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 12, "holds 12"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, "shape [3]"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
            "do not follow each other",
        ),
    ],
    ids=["bytes appended", "shape and size disagree", "overlapping tensors"],
)
def test_convert_checks_safetensors_header_and_sizes(tmp_path, header, data, words):
    from vitviz.zoo.convert import ConvertError, read_state_dict

    path = tmp_path / "ck.safetensors"
    path.write_bytes(_safetensors_bytes(header, data))
    with pytest.raises(ConvertError, match="damaged") as info:
        read_state_dict(path)
    assert words in str(info.value)


def test_a_sound_safetensors_file_passes_the_checks(tmp_path):
    import torch
    from safetensors.torch import save_file

    from vitviz.zoo.convert import read_state_dict

    sd = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.int64), "c": torch.zeros(0)}
    save_file(sd, tmp_path / "ok.safetensors")
    got = read_state_dict(tmp_path / "ok.safetensors")
    assert set(got) == set(sd) and all(torch.equal(got[k], sd[k]) for k in sd)


def test_training_settings_beside_the_weights_are_read_as_data(tmp_path):
    import argparse
    import subprocess
    import sys

    import torch

    from vitviz.zoo.convert import read_state_dict

    sd = {"fc.weight": torch.ones(3, 2)}
    ns = tmp_path / "ns.pth"
    torch.save({"model": sd, "args": argparse.Namespace(lr=0.1, model="cct", depths=[2, 2])}, ns)
    assert torch.equal(read_state_dict(ns)["fc.weight"], sd["fc.weight"])
    # yacs' CfgNode, pickled where yacs exists (a stand-in module of the same name), read where it does not
    fake = tmp_path / "fake" / "yacs"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "config.py").write_text(
        "class CfgNode(dict):\n"
        "    def __init__(self, d=None):\n"
        "        super().__init__(d or {})\n"
        "        self.__dict__['__immutable__'] = False\n"
        "        self.__dict__['__deprecated_keys__'] = set()\n"
    )
    cfg = tmp_path / "cfg.pth"
    code = (
        "import torch; from yacs.config import CfgNode as C; "
        f"torch.save({{'model': {{'fc.weight': torch.ones(3, 2)}}, 'config': C({{'MODEL': C({{'NAME': 'dat'}})}})}}, "
        f"{str(cfg)!r})"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(tmp_path / "fake")}, timeout=120)
    assert torch.equal(read_state_dict(cfg)["fc.weight"], sd["fc.weight"])


def test_code_beside_the_weights_is_still_refused_without_colours_or_unsafe_advice(tmp_path):
    import argparse
    import os

    import torch

    from vitviz.zoo.convert import ConvertError, read_state_dict

    path = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.ones(1)}, "args": argparse.Namespace(hook=os.system)}, path)
    with pytest.raises(ConvertError) as info:
        read_state_dict(path)
    text = str(info.value)
    assert "system" in text and "\x1b" not in text and "weights_only=False" not in text
    assert "\n" not in text


@pytest.mark.parametrize(
    "arch,head,labels,ok",
    [
        ("cct_7_3x1_32_c100", 10, None, False),
        ("cct_7_3x1_32", 100, None, False),
        ("cct_7_3x1_32_c100", 100, None, True),
        ("cct_7_3x1_32_c100", 10, 10, True),
    ],
    ids=["c100 name, 10 classes", "c10 name, 100 classes", "c100 name, 100 classes", "--labels says 10"],
)
def test_convert_checks_the_class_count_the_name_implies(tmp_path, capsys, arch, head, labels, ok):
    import torch

    path = tmp_path / "ck.pth"
    torch.save({"model": _cct_state(head)}, path)
    argv = ["convert", "--arch", arch, "--checkpoint", str(path), "--out", str(tmp_path / "out")]
    if labels:
        (tmp_path / "l.txt").write_text("\n".join(f"class {i}" for i in range(labels)))
        argv += ["--labels", str(tmp_path / "l.txt")]
    proc = _cli(capsys, *argv)
    if ok:
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "out" / "model.safetensors").is_file()
    else:
        line = _one_line_error(proc, 1)
        assert f"head has {head} classes" in line and "--labels" in line
        assert not (tmp_path / "out").exists()


def test_a_file_that_is_no_checkpoint_gets_a_reason(tmp_path):
    from vitviz.zoo.convert import ConvertError, read_state_dict

    path = tmp_path / "photo.pth"
    path.write_bytes(b"PK-not-really" + bytes(range(256)) * 4)
    with pytest.raises(ConvertError) as info:
        read_state_dict(path)
    text = str(info.value)
    assert "read safely ()" not in text and "weights_only=False" not in text and "\n" not in text
    assert "read safely (it is not a PyTorch checkpoint" in text
