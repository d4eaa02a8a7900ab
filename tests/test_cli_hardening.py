"""Issue 23 (hardening, round 2): the command line and the loaders refuse bad input with a message, never code."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import random_image

from vitviz.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
_HF_CALLS = {"from_pretrained", "pipeline"}


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def _cli(capsys, *args: str) -> Result:
    """``python -m vitviz ARGS`` in this process (argparse's exit codes included)."""
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return Result(code, out, err)


def _one_line_error(proc: Result, code: int = 1) -> str:
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- 4. remote code ---------------------------------------------------------------------------------


def _hf_calls_without_trust_false(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name in _HF_CALLS:  # AutoConfig / AutoProcessor / AutoTokenizer / any model class .from_pretrained
            ok = any(
                k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False
                for k in node.keywords
            )
            if not ok:
                bad.append(f"{path.name}:{node.lineno}")
    return bad


def test_every_hf_loading_call_passes_trust_remote_code_false():
    files = [
        ROOT / "app.py",
        *ROOT.glob("vitviz/**/*.py"),
        *ROOT.glob("pages/**/*.py"),
        *ROOT.glob("benchmarks/**/*.py"),
    ]
    assert len(files) > 20
    bad = [hit for f in files for hit in _hf_calls_without_trust_false(f)]
    assert not bad, f"from_pretrained / Auto* calls without trust_remote_code=False: {bad}"


def test_the_ast_check_finds_calls_without_it(tmp_path):
    src = tmp_path / "x.py"
    src.write_text(
        "AutoConfig.from_pretrained('a')\n"
        "foo.from_pretrained('b', trust_remote_code=False)\n"
        "AutoTokenizer.from_pretrained('c', trust_remote_code=True)\n"
        "m.from_pretrained('d', **kw)\n"
    )
    assert _hf_calls_without_trust_false(src) == ["x.py:1", "x.py:3", "x.py:4"]


def _remote_code_folder(folder: Path, marker: Path, where: str = "config.json") -> Path:
    """A folder whose config asks transformers to import its own ``evil.py``, which writes ``marker``."""
    folder.mkdir(parents=True)
    (folder / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\n"
        "from transformers import ViTConfig\n"
        "class EvilConfig(ViTConfig):\n    model_type = 'evil'\n"
    )
    config = {"model_type": "evil" if where == "config.json" else "vit", "architectures": ["ViTModel"]}
    if where == "config.json":
        config["auto_map"] = {"AutoConfig": "evil.EvilConfig"}
    else:
        (folder / where).write_text(json.dumps({"auto_map": {"AutoImageProcessor": "evil.EvilConfig"}}))
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


@pytest.mark.parametrize("where", ["config.json", "preprocessor_config.json"])
def test_a_folder_asking_for_remote_code_is_refused_even_on_y(tmp_path, where, capsys, monkeypatch):
    marker = tmp_path / "ran.txt"
    folder = _remote_code_folder(tmp_path / "evil-model", marker, where)
    monkeypatch.setattr("builtins.input", lambda prompt="": "y")  # the user answers y to any prompt
    proc = _cli(capsys, "export", "--model", str(folder), "--out", str(tmp_path / "out"), "x.png")
    line = _one_line_error(proc)
    assert not marker.exists()
    assert "auto_map" in line and "code" in line
    assert "[y/N]" not in proc.stdout + proc.stderr


def test_a_cached_hub_repo_asking_for_remote_code_is_refused(tmp_path):
    """The same for a hub id found in the Hugging Face cache (a subprocess: the cache folder is read at import)."""
    import os
    import subprocess
    import sys

    marker = tmp_path / "ran.txt"
    repo = tmp_path / "hub" / "models--someone--evil"
    snap = repo / "snapshots" / ("0" * 40)
    _remote_code_folder(snap, marker)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "vitviz", "export", "--model", "someone/evil", "--out", str(tmp_path / "o"), "x.png"],
        input="y\ny\n",
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    line = _one_line_error(Result(proc.returncode, proc.stdout, proc.stderr))
    assert "auto_map" in line and not marker.exists()


# -- 12. every bad option gets a one-line message ----------------------------------------------------


def _read_only_folder(tmp_path: Path) -> Path:
    """A folder this process cannot write in (root ignores permission bits: a read-only file system then)."""
    import os

    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    if Path("/sys/kernel").is_dir():
        return Path("/sys/kernel")
    pytest.skip("no read-only folder available to root here")


@pytest.fixture
def image(tmp_path) -> Path:
    path = tmp_path / "img.png"
    random_image(0, (40, 40)).save(path)
    return path


EXPORT_CASES = {
    "out is a file": (["--out", "{file}"], 2, "is a file"),
    "out read-only": (["--out", "{ro}/vitviz-out"], 1, "cannot"),
    "query nan": (["--out", "{tmp}/o", "--query-xy", "nan,nan"], 2, "X,Y"),
    "size three numbers": (["--out", "{tmp}/o", "--size", "96", "96", "96"], 2, "--size"),
    "size 0": (["--out", "{tmp}/o", "--size", "0"], 2, "--size 0"),
    "size -96": (["--out", "{tmp}/o", "--size", "-96"], 2, "--size -96"),
    "size 1": (["--out", "{tmp}/o", "--size", "1"], 2, "patch"),
    "class out of range": (["--out", "{tmp}/o", "--causal", "--class", "9999"], 2, "--class 9999"),
    "cuda missing": (["--out", "{tmp}/o", "--device", "cuda"], 1, "CUDA"),
    "model name 5000 chars": (["--out", "{tmp}/o", "--model", "m" * 5000], 1, "neither"),
    "unknown device": (["--out", "{tmp}/o", "--device", "tpu9"], 1, "device"),
}


@pytest.mark.parametrize("case", list(EXPORT_CASES))
def test_export_bad_options_get_one_line(case, tmp_path, image, capsys):
    import torch

    if case == "cuda missing" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    args, code, words = EXPORT_CASES[case]
    (tmp_path / "file.txt").write_text("x")
    fill = {"file": str(tmp_path / "file.txt"), "tmp": str(tmp_path), "ro": "{ro}"}
    if any("{ro}" in a for a in args):
        fill["ro"] = str(_read_only_folder(tmp_path))
    argv = ["export", str(image), *(a.format(**fill) for a in args)]
    proc = _cli(capsys, *argv)
    line = _one_line_error(proc, code)
    assert words in line
    assert len(line) < 600
    assert not list(tmp_path.glob("o/*.npz"))


@pytest.mark.parametrize(
    "args,code,words",
    [
        (["--size", "96", "96", "96"], 2, "--size"),
        (["--size", "0"], 2, "--size 0"),
        (["--device", "cuda"], 1, "CUDA"),
    ],
)
def test_evaluate_bad_options_get_one_line(args, code, words, tmp_path, image, capsys):
    import torch

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = _cli(capsys, "evaluate", "--data", str(image.parent), "--out", str(tmp_path / "r.parquet"), *args)
    assert words in _one_line_error(proc, code)


CONVERT_CASES = {
    "out is a file": ("{file}", None, 2, "is a file"),
    "out read-only": ("{ro}/converted", None, 1, "cannot"),
    "out is a symlink": ("{link}", None, 2, "symbolic link"),
    "labels missing": ("{tmp}/c", "{tmp}/no-labels.txt", 2, "no such file"),
}


@pytest.mark.parametrize("case", list(CONVERT_CASES))
def test_convert_bad_options_get_one_line(case, tmp_path, capsys):
    import torch

    out, labels, code, words = CONVERT_CASES[case]
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "empty")
    ckpt = tmp_path / "ck.pth"
    torch.save({"w": torch.zeros(2)}, ckpt)
    fill = {"file": str(tmp_path / "file.txt"), "tmp": str(tmp_path), "link": str(tmp_path / "link"), "ro": "{ro}"}
    if "{ro}" in out:
        fill["ro"] = str(_read_only_folder(tmp_path))
    argv = ["convert", "--arch", "cct_7_3x1_32", "--checkpoint", str(ckpt), "--out", out.format(**fill)]
    if labels:
        argv += ["--labels", labels.format(**fill)]
    proc = _cli(capsys, *argv)
    assert words in _one_line_error(proc, code)
    assert (tmp_path / "file.txt").read_text() == "x" and not any((tmp_path / "empty").iterdir())


# -- 8. export: budget errors and names that collide ---------------------------------------------------


def test_export_over_the_budget_is_a_message_not_a_zip_error(tmp_path, image, capsys):
    proc = _cli(capsys, "export", str(image), "--out", str(tmp_path / "o"), "--size", "4096")
    line = _one_line_error(proc, 1)
    assert str(image) in line and "memory" in line.lower()
    assert not list((tmp_path / "o").glob("*.npz"))


def test_export_keeps_both_images_of_the_same_name(tmp_path, capsys):
    import numpy as np

    for sub, seed in (("a", 1), ("b", 2), ("c", 3)):
        (tmp_path / sub).mkdir()
        random_image(seed, (40, 40)).save(tmp_path / sub / "x.png")
    (tmp_path / "c" / "x-1.png").write_bytes((tmp_path / "c" / "x.png").read_bytes())
    paths = [str(tmp_path / s / "x.png") for s in ("a", "b", "c")] + [str(tmp_path / "c" / "x-1.png")]
    proc = _cli(capsys, "export", *paths, "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    written = sorted(p.name for p in (tmp_path / "o").glob("*.npz"))
    assert written == ["x-1.npz", "x-2.npz", "x-3.npz", "x.npz"]
    assert f"{paths[1]} written as x-2.npz" in proc.stderr  # x-1 is the fourth input's own name
    assert f"{paths[2]} written as x-3.npz" in proc.stderr
    assert "wrote 4 of 4" in proc.stdout
    # each file holds its own image: a (seed 1) and b (seed 2) differ, c and x-1 (same bytes) agree
    maps = {n: np.load(tmp_path / "o" / n)["rollout"] for n in written}
    assert not np.allclose(maps["x.npz"], maps["x-2.npz"])
    np.testing.assert_array_equal(maps["x-3.npz"], maps["x-1.npz"])


# -- 11. weights that are not finite, configs that promise more than the weights hold ----------------


def _tiny_vit(folder: Path, layers: int = 2, poison: dict[str, float] | None = None) -> Path:
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
    )
    torch.manual_seed(0)
    model = ViTForImageClassification(cfg)
    with torch.no_grad():
        for key, value in (poison or {}).items():
            model.get_parameter(key).view(-1)[3] = value
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_weights_with_nan_or_inf_are_refused_naming_the_tensors(tmp_path, capsys, value):
    poison = {"vit.layers.1.attention.q_proj.weight": value, "vit.layers.0.mlp.fc1.bias": value}
    folder = _tiny_vit(tmp_path / "nan", poison=poison)
    proc = _cli(capsys, "export", "x.png", "--model", str(folder), "--out", str(tmp_path / "o"))
    line = _one_line_error(proc, 1)
    assert "NaN or infinite in 2 tensors" in line
    assert "vit.layers.1.attention.q_proj.weight" in line and "vit.layers.0.mlp.fc1.bias" in line


def test_a_config_promising_more_layers_than_the_weights_hold_is_refused(tmp_path, capsys):
    folder = _tiny_vit(tmp_path / "deep", layers=2)
    config = json.loads((folder / "config.json").read_text())
    config["num_hidden_layers"] = 200
    (folder / "config.json").write_text(json.dumps(config))
    proc = _cli(capsys, "export", "x.png", "--model", str(folder), "--out", str(tmp_path / "o"))
    line = _one_line_error(proc, 1)
    # 198 layers of 16 tensors each are missing (query/key/value/output/intermediate weights and biases, 2 norms)
    per_layer, rest = 16, 40 - 2 * 16  # a 2-layer tiny ViT classifier has 40 tensors
    assert f"lack {198 * per_layer} of the {rest + 200 * per_layer} tensors" in line and "promises 200 layers" in line
    assert "vit.layers.2.attention.q_proj.weight" in line


def test_a_missing_head_alone_still_loads(tmp_path):
    """A few head weights missing (a backbone checkpoint under a classifier class) stay accepted."""
    from safetensors.torch import load_file, save_file

    from vitviz.models.load import load_model

    folder = _tiny_vit(tmp_path / "headless")
    state = load_file(folder / "model.safetensors")
    save_file(
        {k: v for k, v in state.items() if not k.startswith("classifier.")},
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
    assert load_model(str(folder), device="cpu").has_classifier


# -- 9. evaluate never replaces finished results of other settings without --overwrite ---------------


@pytest.fixture(scope="module")
def demo():
    from vitviz.models.load import load_model

    return load_model("demo", device="cpu")


@pytest.mark.parametrize(
    "change",
    [{"methods": ("random", "attention")}, {"size": 56}, {"seed": 4}, {"model": "assets/demo-vit"}],
    ids=["methods", "size", "seed", "model"],
)
def test_evaluate_refuses_to_replace_results_of_other_settings(demo, tmp_path, change, one_thread):
    import pyarrow.parquet as pq

    from vitviz.data.shapes import write_dataset
    from vitviz.evaluate.run import EvaluateError, evaluate_dataset

    data = write_dataset(tmp_path / "shapes", n=2, seed=5)
    out = tmp_path / "r.parquet"
    base = {"methods": ("random",), "size": 48, "seed": 3, "loaded": demo}
    first = evaluate_dataset("demo", data, out, **base)
    assert first.evaluated == 2
    before = out.read_bytes()
    kw = {**base, **change}
    model = kw.pop("model", "demo")
    if model != "demo":  # the same weights under another name (their folder) is another --model
        model = str(ROOT / "vitviz" / model)
        kw.pop("loaded")
    with pytest.raises(EvaluateError, match=r"other settings.*--overwrite"):
        evaluate_dataset(model, data, out, **kw)
    assert out.read_bytes() == before
    again = evaluate_dataset("demo", data, out, **base)  # the same settings: runs as before
    assert again.evaluated == 2
    replaced = evaluate_dataset(model, data, out, overwrite=True, **kw)
    assert replaced.evaluated == 2
    rows = pq.read_table(out).to_pylist()
    assert {r["method"] for r in rows} == set(kw["methods"])


def test_evaluate_cli_refuses_a_foreign_out_file(tmp_path, capsys):
    from vitviz.data.shapes import write_dataset

    data = write_dataset(tmp_path / "shapes", n=1, seed=5)
    out = tmp_path / "notes.parquet"
    out.write_text("my own notes")
    args = ["evaluate", "--data", str(data), "--out", str(out), "--methods", "random", "--size", "48"]
    line = _one_line_error(_cli(capsys, *args), 1)
    assert "not vitviz results" in line and out.read_text() == "my own notes"
    assert _cli(capsys, *args, "--overwrite").returncode == 0


# -- 10. evaluate --data opens regular files only, size checked first ---------------------------------


@pytest.fixture
def alarm():
    """Fail instead of hanging: a blocked open or an endless read raises after 60 s."""
    import signal

    def stop(signum, frame):
        raise TimeoutError("blocked: evaluate read something it should not have")

    before = signal.signal(signal.SIGALRM, stop)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


def test_evaluate_folder_reads_regular_files_only(demo, tmp_path, alarm, one_thread):
    import os

    from vitviz.evaluate.run import evaluate_dataset

    data = tmp_path / "data"
    data.mkdir()
    random_image(1, (48, 48)).save(data / "a.png")
    os.mkfifo(data / "fifo.png")
    (data / "zero.png").symlink_to("/dev/zero")
    with open(data / "huge.png", "wb") as fh:  # sparse: 201 MB on paper, nothing on disk
        fh.truncate(201 * 2**20)
    (data / "link.png").symlink_to(data / "a.png")  # a link to a regular file is read
    report = evaluate_dataset("demo", data, tmp_path / "r.parquet", methods=("random",), size=48, loaded=demo)
    assert report.evaluated == 2
    why = {Path(s.where).name: s.reason for s in report.skipped}
    assert set(why) == {"fifo.png", "zero.png", "huge.png"}
    assert "FIFO" in why["fifo.png"] and "device" in why["zero.png"] and "201 MB" in why["huge.png"]


def test_evaluate_csv_rows_naming_a_fifo_or_a_device_are_skipped(tmp_path, alarm):
    import os

    from vitviz.evaluate.data import read_csv

    os.mkfifo(tmp_path / "f.png")
    random_image(1, (48, 48)).save(tmp_path / "a.png")
    (tmp_path / "l.csv").write_text("file,label\na.png,x\nf.png,y\n/dev/zero,z\n")
    ds = read_csv(tmp_path / "l.csv")
    assert [i.image_id for i in ds.items] == ["a.png"]
    assert [s.where for s in ds.skipped] == ["l.csv:3", "l.csv:4"]
    assert "FIFO" in ds.skipped[0].reason and "device" in ds.skipped[1].reason


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
