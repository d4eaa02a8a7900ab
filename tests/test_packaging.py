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
def installed(tmp_path_factory) -> Path:
    """The bin/ folder of a fresh virtual environment with the wheel built from this checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp / "dist"), str(ROOT)],
        check=True,
        capture_output=True,
    )
    wheels = list((tmp / "dist").glob("vitviz-*.whl"))
    assert len(wheels) == 1 and list((tmp / "dist").glob("vitviz-*.tar.gz"))
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(tmp / "env")], check=True)
    pip = [str(tmp / "env" / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    subprocess.run([*pip, str(wheels[0])], check=True, capture_output=True)
    return tmp / "env" / "bin"


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
