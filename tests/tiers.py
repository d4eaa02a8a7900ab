"""The test tiers, in one place: which tests drive a real browser, and which are slow.

``pytest -m "not slow and not browser" -n 2`` is the inner loop (under 2 minutes on 2 cores); ``bash .ci/run``
runs everything. ``conftest.pytest_collection_modifyitems`` applies these marks:

* ``browser``: the test starts Chromium (its own source, or every test of its module, does);
* ``slow``: whole modules and single tests named below, and every test whose measured time (setup, call and
  teardown, from ``tests/durations.json``) is over ``SLOW_SECONDS``. The file is measured, not guessed: run
  the fast tier on a quiet 2-core machine with ``--junitxml=FILE`` and ``python tests/tiers.py FILE`` merges
  its times in (a test's module fixtures count in the first test that builds them, so measure again after a
  change of tiers until the fast tier's own time stays under its goal, 3 minutes).
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
DURATIONS = HERE / "durations.json"  # node id -> seconds, as measured (see the module docstring)
SLOW_SECONDS = 2.0

# Source that starts a browser or a served app: a test whose own code calls one of these is a browser test.
BROWSER_CALLS = ("require_chromium(", "sync_playwright(", "streamlit_server(", "open_server_heads(", "chromium.launch(")
# Modules whose every test drives a browser (through module-level helpers).
BROWSER_MODULES = {
    "test_browser.py",
    "test_browser_pages.py",
    "test_notebook_browser.py",
    "test_benchmark_load.py",
    "test_benchmark_side_by_side.py",
    "test_benchmark_zeroshot.py",
}
# Modules whose tests are all slow, and single slow tests ("file.py::name" without parameters).
SLOW_MODULES = {
    "test_packaging.py",  # builds a wheel and installs it into a fresh virtual environment
    "test_notebook.py",  # starts a Jupyter kernel and runs docs/notebook.ipynb
    "test_ray.py",  # Ray (the session's one local cluster, tests/conftest.py local_ray)
    "test_sae_index_ray.py",  # Ray (the session's local cluster)
    "test_sae_train_ray.py",  # Ray actors collect activations, then two trainings compared bit for bit
    "test_faithfulness.py",  # 500-image and 200-image demo statistics
    "test_relevance_demo_square.py",
    "test_head_estimate.py",
}
SLOW_TESTS = {  # measured on 2 busy cores, 2026-11-27 (--durations): 10-40 s each
    "test_export.py::test_labels_give_the_models_own_logits_per_image",
    "test_export.py::test_labels_the_tokenizer_does_not_know_are_a_warning",
    "test_export.py::test_labels_on_a_model_without_a_text_tower_are_refused",
    "test_export.py::test_cli_query_xy_on_a_cvt",
    "test_export.py::test_causal_export_on_the_demo_model",
    "test_export.py::test_causal_export_says_what_a_hierarchical_model_lacks",
    "test_export.py::test_cli_export_unknown_method_is_a_clear_error",
    "test_forward.py::test_dinov2_base_shape_at_518_fits_the_default_budget",
    "test_views_causal.py::test_causal_views_drawn_twice_with_two_states_show_each_states_own_numbers",
    # 160 s with the machine's load average at 11 (2026-11-27): patching at 2,041 tokens while 2 sessions browse
    "test_benchmark_load.py::test_a_patching_session_at_the_widest_input_while_others_browse",
    "test_wide_upload_server.py::test_wide_uploads_fall_back_under_max_tokens_and_do_not_accumulate",  # 46-68 s
    "test_sae_demo_index.py::test_the_command_rebuilds_the_bundled_index",  # 200 images written and indexed
}


@functools.lru_cache(maxsize=1)
def measured() -> dict[str, float]:
    """``tests/durations.json``: node id -> seconds (empty when the file is missing)."""
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _fixture_funcs(item) -> list:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {}) or {}
    return [d.func for name in item.fixturenames for d in defs.get(name, ())]


@functools.cache
def _starts_browser(func) -> bool:
    """Whether a fixture's own source starts a browser or a served app (its test is then a browser test)."""
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):
        return False
    return any(call in source for call in BROWSER_CALLS)


def tier_marks(item) -> tuple[bool, bool]:
    """(browser, slow) for a collected test item."""
    module = item.path.name
    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError):
        source = ""
    browser = (
        module in BROWSER_MODULES
        or any(call in source for call in BROWSER_CALLS)
        or any(_starts_browser(f) for f in _fixture_funcs(item))
    )
    name = f"{module}::{item.originalname if hasattr(item, 'originalname') else item.name}"
    slow = module in SLOW_MODULES or name in SLOW_TESTS or measured().get(item.nodeid, 0.0) > SLOW_SECONDS
    return browser, slow


def junit_durations(path: Path, root: Path = HERE.parent) -> dict[str, float]:
    """Node id -> seconds from a pytest ``--junitxml`` file (``classname`` ``tests.a.test_b[.Class]``)."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        for cut in range(len(parts), 0, -1):  # the longest prefix that is a file; the rest are classes
            file = Path(*parts[:cut]).with_suffix(".py")
            if (root / file).is_file():
                node = "::".join([file.as_posix(), *parts[cut:], case.get("name", "")])
                out[node] = round(float(case.get("time", 0.0)), 2)
                break
    return out


if __name__ == "__main__":  # python tests/tiers.py JUNIT.xml: merge its times into tests/durations.json
    merged = {**measured(), **junit_durations(Path(sys.argv[1]))}
    DURATIONS.write_text(json.dumps(dict(sorted(merged.items())), indent=0) + "\n")
    print(f"{len(merged)} tests timed; over {SLOW_SECONDS} s (slow): {sum(v > SLOW_SECONDS for v in merged.values())}")
