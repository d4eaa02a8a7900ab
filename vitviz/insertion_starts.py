"""What insertion starts from: the choices, the default, and each one's name and definition where it is shown.

The images themselves are made in :mod:`vitviz.evaluate.faithfulness` (``insertion_start_image``; its module
docstring and ``docs/definitions.md#insertion-starts`` define them); the command line, the pages and the results read these. It sits
outside :mod:`vitviz.evaluate`, whose package imports torch, so that ``python -m vitviz --help`` does not.
"""

from __future__ import annotations

__all__ = ["INSERTION_STARTS", "DEFAULT_INSERTION_START", "INSERTION_START_NAMES", "INSERTION_START_MEANINGS"]

INSERTION_STARTS = ("blur", "mean", "grey", "noise")
DEFAULT_INSERTION_START = "mean"

# Short, for a sentence: "insertion puts them back into <name>".
INSERTION_START_NAMES = {
    "blur": "the image blurred",
    "mean": "the image's mean colour",
    "grey": "a fixed grey",
    "noise": "seeded noise",
}

# What the first image of the insertion curve is (docs/definitions.md#insertion-starts).
INSERTION_START_MEANINGS = {
    "blur": "the input blurred, sigma = patch size / 2 (RISE's start; keeps colour: where colour is the evidence, "
    "as on the demo shapes, every curve starts near the top and ties with random)",
    "mean": "every pixel the image's mean colour (the deletion fill)",
    "grey": "every channel at half its range (127.5 / 255)",
    "noise": "i.i.d. uniform noise over each channel's range, seeded per image like the random map",
}
