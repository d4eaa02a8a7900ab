"""The insertion starts: one definition, read by the engine, the command line and the pages."""

import importlib
import subprocess
import sys

from vitviz.insertion_starts import (
    DEFAULT_INSERTION_START,
    INSERTION_START_MEANINGS,
    INSERTION_START_NAMES,
    INSERTION_STARTS,
)


def test_every_start_is_named_and_defined_and_the_engine_makes_the_same_ones():
    faithfulness = importlib.import_module("vitviz.evaluate.faithfulness")
    assert set(INSERTION_START_NAMES) == set(INSERTION_START_MEANINGS) == set(INSERTION_STARTS)
    assert DEFAULT_INSERTION_START in INSERTION_STARTS
    assert faithfulness.INSERTION_STARTS is INSERTION_STARTS
    assert faithfulness.DEFAULT_INSERTION_START == DEFAULT_INSERTION_START


def test_the_command_line_offers_exactly_these_starts():
    from vitviz.__main__ import build_parser

    action = next(
        a
        for a in build_parser()._subparsers._group_actions[0].choices["evaluate"]._actions
        if a.dest == "insertion_start"
    )
    assert tuple(action.choices) == INSERTION_STARTS and action.default == DEFAULT_INSERTION_START


def test_naming_a_start_imports_no_torch():
    """The command line builds its parser (with these choices) without torch: ``vitviz --help`` stays quick."""
    code = "import sys, vitviz.__main__, vitviz.insertion_starts; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"
