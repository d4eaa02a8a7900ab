"""``vitviz app``: start the Streamlit app from wherever vitviz is installed.

The app (``app.py`` and ``pages/``) sits beside the ``vitviz`` package in a source
checkout; a wheel installs the same files as the package ``vitviz_app`` (see
``pyproject.toml``). The Streamlit settings the app relies on (upload limit, no magic,
no usage statistics) live in ``.streamlit/config.toml`` beside ``app.py``; Streamlit
only reads that file from the current directory, so they are passed as command-line
flags, and the app behaves the same whatever directory it is started from.

Streamlit is started as a child process (``python -m streamlit run``): the engine
never imports Streamlit. ``vitviz app`` stays in front of it: SIGTERM (a service manager,
``kill PID``) and SIGHUP are passed on to the child and waited for (killed after
:data:`STOP_WAIT_S`), as Ctrl-C is, so stopping ``vitviz app`` never leaves Streamlit
listening on the port.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

from vitviz.errors import VitvizError
from vitviz.serve.settings import app_script

__all__ = ["app_script", "streamlit_flags", "port_problem", "app_command", "run_app", "STOP_WAIT_S"]

STOP_WAIT_S = 10.0  # how long a stopped app's Streamlit child may take to exit before it is killed


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
    own = ("--server.port=", "--server.address=")  # given below: the config's values would be a second flag
    flags = [f for f in streamlit_flags(script.parent / ".streamlit" / "config.toml") if not f.startswith(own)]
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(script),
        *flags,
        f"--server.port={port}",
        f"--server.address={address}",
    ]


class _Stop(Exception):
    """A signal asked ``vitviz app`` to stop (its number in ``args[0]``)."""


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
    print(f"vitviz app: open http://{address}:{port} in a browser (Ctrl-C stops it)", file=sys.stderr)
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def stop(signum, frame) -> None:
        raise _Stop(signum)

    before = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            before[sig] = signal.signal(sig, stop)
        except ValueError:  # not the main thread (run_app called from a thread): signals stay as they are
            break
    try:
        return proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the child too (one process group); SIGINT again is harmless
        _stop_child(proc, signal.SIGINT)
        return 130
    except _Stop as exc:
        _stop_child(proc, exc.args[0])
        return 128 + int(exc.args[0])
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if proc.poll() is None:  # any other way out (an error here): never leave the server behind
            _stop_child(proc, signal.SIGTERM)


def _stop_child(proc: subprocess.Popen, signum: int) -> None:
    """Pass ``signum`` to the child and wait for it; kill it after :data:`STOP_WAIT_S`."""
    if proc.poll() is None:
        proc.send_signal(signum)
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
