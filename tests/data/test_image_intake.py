"""What ``load_image`` accepts besides encoded bytes: paths (regular files only, size checked before reading),
PIL images and arrays (the same pixel limits as uploads), and what it refuses with a message (issue 32.14,
32.16, 33.8, 33.13)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitviz.data import images
from vitviz.data.images import image_from_array, load_image
from vitviz.errors import ImageError

ROOT = Path(__file__).resolve().parents[2]
RGB = np.random.default_rng(0).integers(0, 256, (6, 10, 3), dtype=np.uint8)


def test_a_device_is_refused_without_reading_it():
    """Issue 33.8: ``/dev/zero`` was read until memory ran out (3.8 GB in 22 s). Run in a child with 1.5 GB of
    address space, so that a reader without bounds fails there instead of taking this machine's memory."""
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1536 * 2**20, 1536 * 2**20))\n"
        "from vitviz.data.images import load_image\n"
        "from vitviz.errors import ImageError\n"
        "try:\n"
        "    load_image('/dev/zero')\n"
        "except ImageError as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused:" in done.stdout and "not a regular file" in done.stdout, done.stdout


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "photo.png"
    os.mkfifo(fifo)  # opening it to read would block until a writer comes
    with pytest.raises(ImageError, match="not a regular file"):
        load_image(fifo)
    with pytest.raises(ImageError, match="folder"):
        load_image(tmp_path)


def test_a_file_over_the_limit_is_refused_before_reading(tmp_path, monkeypatch):
    big = tmp_path / "big.png"
    with big.open("wb") as f:  # sparse: no disk used
        f.truncate(images.MAX_BYTES + 1)

    def no_read(*args, **kwargs):
        raise AssertionError("the file was read although its size is over the limit")

    monkeypatch.setattr(Path, "read_bytes", no_read)
    monkeypatch.setattr(os, "read", no_read)
    with pytest.raises(ImageError, match="MB"):
        load_image(big)


def test_urls_are_refused_with_a_message_not_read_as_paths():
    """Issue 32.16: a URL became the path ``https:/...`` and a 'cannot read' message about a file."""
    for url in ("https://example.com/cat.jpg", "http://127.0.0.1:1/x.png", "ftp://host/x.png"):
        with pytest.raises(ImageError, match="URL") as info:
            load_image(url)
        assert "https:/example" not in str(info.value)
        assert "urlretrieve" in str(info.value)


def test_pil_images_get_the_pixel_limits_of_uploads(monkeypatch):
    """Issue 33.8: a 20000 x 20000 PIL image was accepted without the pixel limit the app applies."""
    with pytest.raises(ImageError, match="pixels"):
        load_image(Image.new("L", (images.MAX_SIDE + 1, 1)))
    monkeypatch.setitem(images._LIMITS, "max_pixels", 50)
    with pytest.raises(ImageError, match="megapixels"):
        load_image(Image.new("RGB", (10, 10)))
    assert load_image(Image.new("RGB", (5, 10))).size == (5, 10)


def test_messages_say_nothing_of_uploads(tmp_path):
    """Issue 32.16: the command line and the notebook said 'Upload a PNG'."""
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    text = tmp_path / "notes.png"
    text.write_bytes(b"hello, I am text")
    for path in (empty, text):
        with pytest.raises(ImageError) as info:
            load_image(path)
        assert "upload" not in str(info.value).lower()


# --- arrays -----------------------------------------------------------------------------------------


def test_uint8_arrays_are_taken_as_they_are():
    assert np.array_equal(np.asarray(image_from_array(RGB)), RGB)


def test_float_arrays_in_0_1_are_scaled_to_8_bits():
    """Issue 32.14: a float image in 0..1 became black (and the prediction changed)."""
    x = RGB.astype(np.float32) / 255
    assert np.array_equal(np.asarray(image_from_array(x)), RGB)
    assert np.array_equal(np.asarray(image_from_array(x.astype(np.float64))), RGB)


def test_channels_first_and_grey_arrays():
    """Issue 32.14: a channels-first array was PIL's TypeError."""
    assert np.array_equal(np.asarray(image_from_array(RGB.transpose(2, 0, 1))), RGB)
    grey = RGB[..., 0]
    for arr in (grey, grey[..., None], grey[None]):
        out = np.asarray(image_from_array(arr))
        assert out.shape == (6, 10, 3) and all(np.array_equal(out[..., c], grey) for c in range(3))


def test_rgba_arrays_are_flattened_on_white():
    rgba = np.zeros((2, 3, 4), np.uint8)
    rgba[..., 0] = 255  # red, fully transparent
    assert np.asarray(image_from_array(rgba))[0, 0].tolist() == [255, 255, 255]


def test_integer_arrays_in_0_255_are_accepted():
    assert np.array_equal(np.asarray(image_from_array(RGB.astype(np.int64))), RGB)


@pytest.mark.parametrize(
    "array,words",
    [
        (np.full((4, 4, 3), np.nan, np.float32), "NaN"),  # issue 33.13: black, with a warning
        (np.zeros((0, 0, 3), np.uint8), "no pixels"),  # issue 33.13
        (np.zeros((0, 0), np.uint8), "no pixels"),
        (np.zeros((1, 3, 8, 8), np.float32), "4-d|batch"),  # issue 33.13
        (np.zeros((8,), np.uint8), "1-d"),
        (np.zeros((8, 8, 2), np.uint8), "channels"),
        (np.full((4, 4, 3), 2.0, np.float32), "0..1|divide"),
        (np.full((4, 4, 3), 300, np.int32), "0..255"),
        (np.full((4, 4, 3), -1, np.int16), "0..255"),
        (np.array([["a"]], dtype=object), "numbers"),
        (np.zeros((1, images.MAX_SIDE + 1), np.uint8), "pixels"),
    ],
)
def test_arrays_vitviz_cannot_read_get_one_clear_message(array, words):
    with pytest.raises(ImageError, match=words):
        image_from_array(array)


def test_load_image_takes_arrays_too():
    assert np.array_equal(np.asarray(load_image(RGB)), RGB)
