"""The command line's processes and files (issue 32.18, 33.10): ``vitviz app`` stops its Streamlit child on
SIGTERM, the app listens on 127.0.0.1 however it is started, ``export`` creates nothing before its inputs are
checked, ``train-demo`` never writes over the bundled model by default, and loads print no progress bars."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from tests.browser_tools import free_port
from vitviz.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
STAR = ROOT / "assets" / "examples" / "demo-star.png"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _wait_healthy(url: str, proc: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited early with {proc.returncode}")
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail("the server never answered its health check")


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) == 0


def _stop_group(proc: subprocess.Popen) -> None:
    """Whatever is left of a server started in its own session (a test's cleanup, not what it checks)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_sigterm_stops_the_app_and_its_streamlit_child():
    """Issues 32.18 and 33.10: SIGTERM to ``vitviz app`` left Streamlit listening on the port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vitviz", "app", "--port", str(port)],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group, so that cleanup reaches a child left behind
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
        os.kill(proc.pid, signal.SIGTERM)  # vitviz only, as a service manager or `kill PID` does
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        assert not _listening("127.0.0.1", port), "Streamlit still listens after vitviz app exited"
    finally:
        _stop_group(proc)


def _outside_address() -> str | None:
    """An address of this machine other than loopback (None when it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
            ip = s.getsockname()[0]
        except OSError:
            return None
    return None if ip.startswith("127.") else ip


def test_streamlit_run_app_listens_on_this_machine_only():
    """Issue 32.18: ``streamlit run app.py`` (the README's command) listened on every interface."""
    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "127.0.0.1"
    outside = _outside_address()
    if outside is None:
        pytest.skip("this machine has no address but loopback: nothing to tell apart")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port)],
        cwd=ROOT,  # Streamlit reads .streamlit/config.toml from here
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", proc)
        assert not _listening(outside, port)
    finally:
        _stop_group(proc)


def test_the_app_command_passes_the_address_once():
    from vitviz.launch import app_command

    cmd = app_command(8501, "0.0.0.0")
    assert [a for a in cmd if a.startswith("--server.address")] == ["--server.address=0.0.0.0"]
    assert [a for a in cmd if a.startswith("--server.port")] == ["--server.port=8501"]


def test_app_help_promises_no_browser_it_does_not_open(capsys):
    """Issue 32.18: ``vitviz app --help`` promised a browser that never opens (the server is headless)."""
    with pytest.raises(SystemExit):
        main(["app", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "in this machine's browser" not in text and "prints its address" in text
    with pytest.raises(SystemExit):
        main(["--help"])  # the one-line list of commands
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("app"))
    assert "browser" not in line.replace("open it in a browser", "")


def test_export_of_a_missing_file_creates_no_output_folder(tmp_path, capsys):
    """Issue 32.18: ``export`` of a missing file created an empty ``--out``."""
    out = tmp_path / "out"
    assert main(["export", "--model", "demo", "--out", str(out), str(tmp_path / "missing.png")]) == 1
    assert not out.exists()
    err = capsys.readouterr().err
    assert "missing.png" in err and "no such file" in err


def test_export_with_a_model_that_does_not_load_creates_no_output_folder(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", "--model", "Demo", "--out", str(out), str(STAR)]) == 1
    assert not out.exists() and "did you mean 'demo'" in capsys.readouterr().err


def test_export_of_some_missing_files_exports_the_others(tmp_path, capsys, one_thread):
    out = tmp_path / "out"
    assert main(["export", "--model", "demo", "--out", str(out), str(STAR), str(tmp_path / "missing.png")]) == 1
    assert (out / "demo-star.npz").is_file()
    assert "wrote 1 of 2" in capsys.readouterr().out


@pytest.fixture
def trainers(monkeypatch):
    """Each demo trainer replaced by one that records where it would write."""
    from types import SimpleNamespace

    from vitviz.demo import clip, swin, vit

    calls = []

    def fake(out, **kwargs):
        calls.append(Path(out))
        return SimpleNamespace(accuracy=1.0, peak_in_box=1.0)

    monkeypatch.setattr(vit, "train_demo", fake)
    monkeypatch.setattr(swin, "train_swin_demo", fake)
    monkeypatch.setattr(clip, "train_clip_demo", fake)
    return calls


def test_train_demo_without_out_refuses_to_overwrite_the_bundled_model(trainers, capsys):
    """Issue 32.18: ``train-demo`` without ``--out`` wrote over the installed package's bundled model."""
    from vitviz.models.bundled import BUNDLED

    for arch in ("vit", "swin", "clip"):
        assert main(["train-demo", "--arch", arch]) == 2
        err = capsys.readouterr().err
        assert "--out" in err and "--overwrite-bundled" in err
    assert main(["train-demo", "--out", str(BUNDLED["demo"] / "x")]) == 2  # inside the bundled folder
    assert trainers == []
    assert main(["train-demo", "--arch", "swin", "--overwrite-bundled"]) == 0
    assert trainers == [BUNDLED["demo-swin"]]


def test_train_demo_writes_where_out_says(trainers, tmp_path):
    assert main(["train-demo", "--out", str(tmp_path / "mine")]) == 0
    assert trainers == [tmp_path / "mine"]


def test_export_prints_no_loading_bars(tmp_path):
    """Issue 32.18: every command's model load printed "Loading weights" bars."""
    done = subprocess.run(
        [sys.executable, "-m", "vitviz", "export", "--model", "demo", "--out", str(tmp_path / "o"), str(STAR)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Loading weights" not in done.stderr
