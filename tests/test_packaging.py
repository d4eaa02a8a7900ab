"""`pip install .`: the wheel holds the engine, the app and the bundled models, and its `vitviz` command works.

Builds the sdist and the wheel from it (``python -m build --no-isolation``: the build tools installed here, no
download), installs the wheel into a fresh virtual environment that sees this machine's packages (torch and the
rest are not reinstalled), and from a directory outside the checkout runs ``vitviz export --model demo`` and
``vitviz app`` to a page that renders in Chromium.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.browser_tools import CHROMIUM, FLAGS, free_port, require_chromium

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_subpackage_of_vitviz_is_packaged():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    on_disk = {"vitviz", "vitviz_app"}
    for top, name in (("vitviz", "vitviz"), ("pages", "vitviz_app.pages"), ("ui", "vitviz_app.ui")):
        for p in [ROOT / top, *(ROOT / top).rglob("*")]:
            if p.is_dir() and p.name != "__pycache__" and any(p.glob("*.py")):
                on_disk.add(".".join((name, *p.relative_to(ROOT / top).parts)))
    assert on_disk <= listed, f"add to pyproject's packages: {sorted(on_disk - listed)}"


def test_the_licence_is_mit_in_a_file_and_in_the_metadata():
    """Issue 32.17: no LICENSE file and no licence in the metadata."""
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "WITHOUT WARRANTY OF ANY KIND" in text
    project = _pyproject()["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]  # SPDX expression (PEP 639)
    assert any(r.startswith("setuptools>=77") for r in _pyproject()["build-system"]["requires"])  # reads PEP 639


def test_version_comes_from_the_package_metadata_or_the_checkout(capsys):
    """Issue 32.17: no ``vitviz --version`` and no ``vitviz.__version__``."""
    import vitviz
    from vitviz.__main__ import main

    assert vitviz.__version__ == _pyproject()["project"]["version"]
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip().endswith(vitviz.__version__)


def test_the_example_images_attribution_cites_the_code_that_makes_them():
    """Issue 32.17: ATTRIBUTION.md cited ``vitviz.demo_data``, a module that does not exist."""
    import importlib
    import re

    text = (ROOT / "assets" / "examples" / "ATTRIBUTION.md").read_text(encoding="utf-8")
    for dotted in re.findall(r"`(vitviz(?:\.\w+)+)", text):
        module, _, name = dotted.rpartition(".")
        assert hasattr(importlib.import_module(module), name), dotted
    calls = re.findall(r"`make_sample\((\d+), label=(\d)\)` -> `([\w-]+\.png)`", text)
    assert len(calls) == 2
    from vitviz.data.shapes import make_sample

    for seed, label, name in calls:
        made = np.asarray(make_sample(int(seed), label=int(label)).image.convert("RGB"))
        assert np.array_equal(made, np.asarray(Image.open(ROOT / "assets" / "examples" / name).convert("RGB")))


def test_runtime_dependencies_are_declared():
    deps = " ".join(_pyproject()["project"]["dependencies"])
    for name in ("torch", "transformers", "safetensors", "numpy", "pillow", "streamlit", "plotly", "pyarrow"):
        assert name in deps
    extras = _pyproject()["project"]["optional-dependencies"]
    assert any(d.startswith("ray") for d in extras["ray"]) and any(d.startswith("pytest") for d in extras["test"])


def test_app_flags_come_from_the_streamlit_config(tmp_path):
    from vitviz.launch import streamlit_flags

    cfg = tmp_path / "config.toml"
    cfg.write_text('[server]\nmaxUploadSize = 20\nheadless = true\n[client]\ntoolbarMode = "minimal"\n')
    assert streamlit_flags(cfg) == [
        "--server.maxUploadSize=20",
        "--server.headless=true",
        "--client.toolbarMode=minimal",
    ]
    assert streamlit_flags(tmp_path / "missing.toml") == []


def test_app_on_a_busy_port_gets_a_message(capsys):
    import socket

    from vitviz.__main__ import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["app", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"port {port}" in err and "busy" in err and "Traceback" not in err
    assert main(["app", "--port", "70000"]) == 1
    assert "between 1 and 65535" in capsys.readouterr().err


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The dist/ folder of ``python -m build`` on this checkout (sdist, then the wheel from it), and its output."""
    tmp = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp / "dist"), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    return tmp / "dist", done.stdout + done.stderr


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory) -> Path:
    """The bin/ folder of a fresh virtual environment with the wheel built from this checkout."""
    dist, _ = built
    tmp = tmp_path_factory.mktemp("env")
    wheels = list(dist.glob("vitviz-*.whl"))
    assert len(wheels) == 1 and list(dist.glob("vitviz-*.tar.gz"))
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(tmp / "env")], check=True)
    pip = [str(tmp / "env" / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*pip, str(wheels[0])], check=True, capture_output=True)
    return tmp / "env" / "bin"


def test_the_build_warns_of_nothing(built):
    """Issue 32.17: ``python -m build`` warned twice (data folders setuptools was not told of)."""
    _, log = built
    warnings = [line for line in log.splitlines() if "WARNING" in line or "Warning:" in line]
    assert not warnings, warnings


def test_the_sdist_holds_the_tests_with_their_subfolders_and_the_licence(built):
    """Issue 32.17: the sdist lacked the tests' subfolders, so its tests could not run."""
    import tarfile
    import zipfile

    dist, _ = built
    with tarfile.open(next(dist.glob("vitviz-*.tar.gz"))) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*.py") if "__pycache__" not in p.parts}
    assert on_disk <= names, sorted(on_disk - names)[:5]
    assert {"LICENSE", "docs/notebook.ipynb", "benchmarks/headview.py", "tests/data/test_images.py"} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    with zipfile.ZipFile(next(dist.glob("vitviz-*.whl"))) as whl:
        files = whl.namelist()
        meta = whl.read(next(n for n in files if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: MIT" in meta and any(n.endswith(".dist-info/licenses/LICENSE") for n in files)
    assert not any(n.startswith("tests/") for n in files)
    # the bundled SAE's index and its 200 images, one folder deeper than the other assets
    assert "vitviz/assets/demo-sae-index/index.parquet" in files
    assert sum(n.startswith("vitviz/assets/demo-sae-index/images/") and n.endswith(".jpg") for n in files) == 200


def test_installed_command_exports_with_the_bundled_model(installed, tmp_path):
    Image.new("RGB", (64, 48), (200, 30, 30)).save(tmp_path / "red.png")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(installed / "vitviz"), "export", "--model", "demo", "--out", "out", "red.png"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    with np.load(tmp_path / "out" / "red.npz") as npz:
        assert npz["attentions"].shape[:2] == (4, 4)  # demo: 4 blocks x 4 heads
    # the package imported is the installed one, not this checkout
    where = subprocess.run(
        [str(installed / "python"), "-c", "import vitviz; print(vitviz.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "site-packages" in where.stdout and str(ROOT) not in where.stdout


def test_installed_command_and_package_know_their_version(installed, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    version = _pyproject()["project"]["version"]
    done = subprocess.run(
        [str(installed / "vitviz"), "--version"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == f"vitviz {version}"
    got = subprocess.run(
        [str(installed / "python"), "-c", "import vitviz; print(vitviz.__version__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert got.stdout.strip() == version


def test_installed_train_demo_never_overwrites_the_bundled_model_by_default(installed, tmp_path):
    """Issue 32.18: ``train-demo`` without ``--out`` wrote over the installed package's bundled model."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(installed / "vitviz"), "train-demo", "--steps", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "--out" in done.stderr and "Traceback" not in done.stderr


def test_installed_app_serves_a_healthy_page(installed, tmp_path):
    require_chromium()
    from playwright.sync_api import sync_playwright

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen(
        [str(installed / "vitviz"), "app", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(180):
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("vitviz app never answered its health check")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = browser.new_page()
                page.goto(url)
                page.get_by_text("Checkpoint").first.wait_for(timeout=90_000)
                page.locator("[data-testid='stPlotlyChart']").first.wait_for(timeout=90_000)
                assert page.locator("[data-testid='stException']").count() == 0
            finally:
                browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
