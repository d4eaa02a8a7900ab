"""The app's presets are data in vitviz (issue 20 item 6): importable without Streamlit or torch, consistent."""

import subprocess
import sys

from vitviz.demo import bundled
from vitviz.presets import DEMO_NOTES, PRESETS


def test_presets_start_with_the_bundled_demos_and_each_demo_says_what_it_learned():
    assert PRESETS[: len(bundled())] == tuple(bundled())
    assert len(set(PRESETS)) == len(PRESETS)
    for name in bundled():
        assert "synthetic shapes" in DEMO_NOTES[name] and "photo" in DEMO_NOTES[name]


def test_presets_import_without_streamlit_or_torch():
    code = "import sys, vitviz.presets; print(sorted(m for m in ('streamlit', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
