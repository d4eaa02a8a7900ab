"""``vitviz app``: start the Streamlit app from wherever vitviz is installed.

The app (``app.py`` and ``pages/``) sits beside the ``vitviz`` package in a source
checkout; a wheel installs the same files as the package ``vitviz_app`` (see
``pyproject.toml``). The Streamlit settings the app relies on (upload limit, no magic,
no usage statistics) live in ``.streamlit/config.toml`` beside ``app.py``; Streamlit
only reads that file from the current directory, so they are passed as command-line
flags, and the app behaves the same whatever directory it is started from.

Streamlit is started as a child process (``python -m streamlit run``): the engine
never imports Streamlit.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

from vitviz.errors import VitvizError
from vitviz.serve.settings import app_script

__all__ = ["app_script", "streamlit_flags", "port_problem", "app_command", "run_app"]


def streamlit_flags(config: Path) -> list[str]:
    """``--section.key=value`` flags for every setting of a Streamlit ``config.toml`` (none if it is missing)."""
    if not config.is_file():
        return []
    with config.open("rb") as f:
        table = tomllib.load(f)
    flags = []
    for section, values in table.items():
        for key, value in values.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            flags.append(f"--{section}.{key}={text}")
    return flags


def port_problem(port: int, address: str) -> str:
    """Why the app cannot listen on ``address:port`` ("" when it can)."""
    if not 1 <= port <= 65535:
        return f"--port must be between 1 and 65535, got {port}"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, port))
        except OSError as exc:
            return f"port {port} on {address} is busy or not available ({exc.strerror}): choose another with --port"
    return ""


def app_command(port: int, address: str) -> list[str]:
    """The command line that starts the app on ``address:port``."""
    script = app_script()
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(script),
        *streamlit_flags(script.parent / ".streamlit" / "config.toml"),
        f"--server.port={port}",
        f"--server.address={address}",
    ]


def run_app(port: int = 8501, address: str = "127.0.0.1") -> int:
    """Start the app and wait for it; its exit code (Ctrl-C stops it)."""
    problem = port_problem(port, address)
    if problem:
        raise VitvizError(problem)
    if importlib.util.find_spec("streamlit") is None:
        raise VitvizError("Streamlit is not installed: pip install streamlit (or reinstall vitviz)")
    from vitviz.serve.settings import SettingsError, load_settings, log_settings

    try:  # the app's vitviz.toml (beside app.py, or $VITVIZ_CONFIG): a typo stops here, naming the file in full
        settings = load_settings(folder=app_script().parent)
    except SettingsError as exc:  # exit 2, like any option that cannot work; Streamlit is never started
        from vitviz.cli_checks import UsageError

        raise UsageError(exc.detail) from None
    log_settings(settings)  # which file was read, and whether public mode is on
    cmd = app_command(port, address)
    print(f"vitviz app: http://{address}:{port} (Ctrl-C stops it)", file=sys.stderr)
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=10)
        return 130
