"""Running the command line inside the test process, and reading its one-line errors (tests of every package)."""

from __future__ import annotations

from dataclasses import dataclass

from vitviz.__main__ import main


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
