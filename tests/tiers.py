"""The test tiers, in one place: which tests drive a real browser, and which are slow.

``pytest -m "not slow and not browser"`` is the inner loop (a few minutes on 2 cores); ``bash .ci/run``
runs everything. ``conftest.pytest_collection_modifyitems`` applies these marks:

* ``browser``: the test starts Chromium (its own source, or every test of its module, does);
* ``slow``: measured at over ~10 s on the 2-core CI machine (whole modules, or single tests by node id).
"""

from __future__ import annotations

import inspect

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
    "test_ray.py",  # starts a local Ray cluster
    "test_faithfulness.py",  # 500-image and 200-image demo statistics
    "test_relevance_demo_square.py",
    "test_head_estimate.py",
}
SLOW_TESTS: set[str] = set()


def tier_marks(item) -> tuple[bool, bool]:
    """(browser, slow) for a collected test item."""
    module = item.path.name
    try:
        source = inspect.getsource(item.function)
    except (OSError, TypeError):
        source = ""
    browser = module in BROWSER_MODULES or any(call in source for call in BROWSER_CALLS)
    name = f"{module}::{item.originalname if hasattr(item, 'originalname') else item.name}"
    slow = module in SLOW_MODULES or name in SLOW_TESTS
    return browser, slow
