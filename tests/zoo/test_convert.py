"""convert's safety and messages, whatever the architecture: no code runs, nothing half-written."""

from __future__ import annotations

import pytest
import torch

from vitviz.__main__ import main
from vitviz.zoo.convert import ConvertError, convert, read_state_dict


def test_a_pickled_module_is_refused_without_running_it(tmp_path):
    path = tmp_path / "model.pth"
    torch.save(torch.nn.Linear(2, 2), path)  # an object, not a state dict: weights_only refuses it
    with pytest.raises(ConvertError, match="not a plain state dict"):
        read_state_dict(path)


def test_training_wrappers_and_the_dataparallel_prefix_are_unwrapped(tmp_path):
    sd = {"module.fc.weight": torch.ones(3, 2), "module.fc.bias": torch.zeros(3)}
    path = tmp_path / "ckpt.pth"
    torch.save({"state_dict_ema": sd, "epoch": 3}, path)
    got = read_state_dict(path)
    assert set(got) == {"fc.weight", "fc.bias"} and torch.equal(got["fc.weight"], torch.ones(3, 2))


@pytest.mark.parametrize("content", [b"", b"not a checkpoint at all"])
def test_unreadable_files_get_a_message(tmp_path, content):
    path = tmp_path / "x.pth"
    path.write_bytes(content)
    with pytest.raises(ConvertError):
        read_state_dict(path)


def test_an_unknown_name_lists_the_known_ones_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "x.pth"
    torch.save({"w": torch.ones(1)}, path)
    out = tmp_path / "out"
    with pytest.raises(ConvertError, match=r"Unknown architecture 'resnet50'\. Known official names"):
        convert("resnet50", path, out)
    assert main(["convert", "--arch", "resnet50", "--checkpoint", str(path), "--out", str(out)]) == 1
    assert "Unknown architecture" in capsys.readouterr().err and not out.exists()
