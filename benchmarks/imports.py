"""Import time of vitviz's entry points, each in a fresh interpreter.

:func:`import_times`: wall time of ``python -c "import X"`` for ``vitviz`` (lazy, PEP 562),
every module of ``vitviz.analysis`` and of ``vitviz.figures`` (no torch), and ``vitviz.models.load`` (torch and
transformers, for scale), against ``python -c pass`` (the interpreter's own start). Runs are
interleaved so that drift of the machine's speed hits every row alike; medians are reported.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["TARGETS", "import_times"]

_ALL = "import importlib, pkgutil, {p} as p; [importlib.import_module(f'{p}.' + m.name) for m in pkgutil.iter_modules(p.__path__)]"
TARGETS = {  # row name: the code run in a fresh interpreter
    "python -c pass": "pass",
    "import vitviz": "import vitviz",
    "vitviz.analysis, every module": _ALL.format(p="vitviz.analysis"),
    "vitviz.figures, every module": _ALL.format(p="vitviz.figures"),
    "import vitviz.models.load (torch)": "import vitviz.models.load",
}


def _wall(code: str) -> tuple[float, float]:
    """Wall time of a fresh interpreter running ``code``, and the time ``code`` itself took inside it."""
    timed = f"import time as _t; _s = _t.perf_counter()\n{code}\nprint(_t.perf_counter() - _s)"
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", timed], cwd=ROOT, check=True, capture_output=True, text=True)
    return time.perf_counter() - t, float(done.stdout.split()[-1])


def import_times(runs: int = 5) -> dict:
    """Per row of :data:`TARGETS`, medians over ``runs`` interleaved fresh interpreters (one warm-up round
    first, so the file cache is warm): ``in_process_s``, the import statement's own time; ``wall_s``, the
    whole interpreter's; ``ratio_to_pass``, ``wall_s`` over ``python -c pass``'s."""
    for code in TARGETS.values():  # warm-up: file cache, .pyc files
        _wall(code)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in TARGETS}
    for _ in range(runs):
        for name, code in TARGETS.items():
            times[name].append(_wall(code))
    base = statistics.median(w for w, _ in times["python -c pass"])
    rows = []
    for name, ts in times.items():
        wall = statistics.median(w for w, _ in ts)
        rows.append(
            {
                "import": name,
                "in_process_s": round(statistics.median(i for _, i in ts), 3),
                "wall_s": round(wall, 3),
                "ratio_to_pass": round(wall / base, 2),
            }
        )
    return {"runs": runs, "rows": rows}


def print_rows(result: dict) -> None:
    print(f"\nImport times, fresh interpreter, median of {result['runs']}:")
    print("| import | the import itself (s) | fresh interpreter, wall (s) | ratio to `python -c pass` |")
    print("|---|---|---|---|")
    for r in result["rows"]:
        print(f"| `{r['import']}` | {r['in_process_s']} | {r['wall_s']} | {r['ratio_to_pass']} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.imports", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    result = import_times(args.runs)
    print(json.dumps(result, indent=2))
    print_rows(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
