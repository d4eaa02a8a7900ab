import io

import numpy as np
import pytest
from PIL import Image

from vitviz.data.images import load_image, read_image
from vitviz.errors import ImageError


def _encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt, **kw)
    return buf.getvalue()


RGB = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8), "RGB")


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF"])
def test_common_formats_decode_to_rgb(fmt):
    out = read_image(_encode(RGB, fmt))
    assert out.image.mode == "RGB" and out.image.size == (30, 20)


@pytest.mark.parametrize("mode", ["1", "L", "LA", "P", "RGBA", "CMYK", "I;16", "I", "F"])
def test_modes(mode):
    img = (
        RGB.convert(mode)
        if mode not in ("I;16", "I", "F")
        else Image.fromarray(
            (np.arange(600).reshape(20, 30) * 50).astype({"I;16": np.uint16, "I": np.int32, "F": np.float32}[mode])
        )
    )
    fmt = "TIFF" if mode in ("CMYK", "I;16", "I", "F") else "PNG"
    out = read_image(_encode(img, fmt)).image
    assert out.mode == "RGB" and out.size == (30, 20)


def test_sixteen_bit_is_stretched_not_clipped():
    arr = np.linspace(1000, 60000, 600).reshape(20, 30).astype(np.uint16)
    out = np.asarray(read_image(_encode(Image.fromarray(arr), "PNG")).image)
    assert out.min() == 0 and out.max() == 255


def test_transparency_flattened_on_white():
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    res = read_image(_encode(rgba, "PNG"))
    assert res.image.getpixel((0, 0)) == (255, 255, 255)
    assert any("transparency" in n for n in res.notes)


def test_exif_orientation_applied():
    img = Image.new("RGB", (30, 10), (0, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    out = read_image(_encode(img, "JPEG", exif=exif)).image
    assert out.size == (10, 30)


def test_animated_gif_first_frame_noted():
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0))]
    buf = io.BytesIO()
    frames[0].save(buf, format="GIF", save_all=True, append_images=frames[1:])
    res = read_image(buf.getvalue())
    assert res.image.getpixel((0, 0))[0] > 200
    assert any("first" in n for n in res.notes)


@pytest.mark.parametrize(
    "data,words",
    [
        (b"", "empty"),
        (b"GIF89a not really", "not an image|damaged"),
        (b"hello, I am text", "not an image"),
        (_encode(RGB, "PNG")[:60], "damaged"),
    ],
)
def test_bad_bytes_give_clear_errors(data, words):
    with pytest.raises(ImageError, match=words):
        read_image(data)


def test_pixel_bomb_refused_before_decoding():
    big = _encode(Image.new("L", (9000, 9000)), "PNG")  # compresses to a few kB
    with pytest.raises(ImageError, match="megapixels"):
        read_image(big, max_pixels=10_000_000)


def test_tiny_and_extreme_aspect_ratio():
    assert read_image(_encode(Image.new("RGB", (1, 1)), "PNG")).image.size == (1, 1)
    assert read_image(_encode(Image.new("RGB", (4000, 10)), "PNG")).image.size == (4000, 10)


def test_load_image_paths(tmp_path):
    p = tmp_path / "x.png"
    RGB.save(p)
    assert load_image(p).size == (30, 20)
    with pytest.raises(ImageError, match="Cannot read"):
        load_image(tmp_path / "nope.png")


# Property-based: whatever bytes arrive, the result is an RGB image or an ImageError.
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hst  # noqa: E402

_SEEDS = {
    "PNG": _encode(RGB, "PNG"),
    "JPEG": _encode(RGB, "JPEG"),
    "WEBP": _encode(RGB, "WEBP"),
    "GIF": _encode(RGB.convert("P"), "GIF"),
    "PNG-RGBA": _encode(RGB.convert("RGBA"), "PNG"),
    "TIFF-16": _encode(Image.fromarray(np.arange(600, dtype=np.uint16).reshape(20, 30)), "TIFF"),
}


@hst.composite
def mutated_images(draw):
    data = bytearray(draw(hst.sampled_from(sorted(_SEEDS.values(), key=len))))
    for _ in range(draw(hst.integers(1, 8))):
        op = draw(hst.sampled_from(["flip", "cut", "insert", "truncate", "header"]))
        pos = draw(hst.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[pos] ^= draw(hst.integers(1, 255))
        elif op == "cut":
            del data[pos : pos + draw(hst.integers(1, 64))]
        elif op == "insert":
            data[pos:pos] = draw(hst.binary(min_size=1, max_size=32))
        elif op == "truncate":
            del data[pos:]
        elif op == "header" and len(data) > 24:  # corrupt the width/height fields most formats keep early
            data[16:24] = draw(hst.binary(min_size=8, max_size=8))
    return bytes(data)


def _check(data: bytes) -> None:
    try:
        out = read_image(data, max_pixels=4_000_000)
    except ImageError as exc:
        assert str(exc)
    else:
        assert out.image.mode == "RGB" and out.image.width >= 1 and out.image.height >= 1


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_images())
def test_mutated_images_never_escape(data):
    _check(data)


@settings(max_examples=300, deadline=None)
@given(hst.binary(max_size=2048))
def test_random_bytes_never_escape(data):
    _check(data)


def test_long_thin_image_refused_from_the_header(monkeypatch):
    """Issue 23.3: a 1 x 39 million PNG (about 40 KB) passed the pixel limit and cost 0.9 GB to decode."""
    from vitviz.data import images

    thin = _encode(Image.new("L", (1, 39_000_000)), "PNG")
    assert len(thin) < 200_000
    monkeypatch.setattr(images.DECODE_BUDGET, "reserve", lambda cost: pytest.fail("decoding was started"))
    with pytest.raises(ImageError, match=r"1 x 39000000 pixels; vitviz accepts sides of at most 16,384 pixels"):
        read_image(thin)
    with pytest.raises(ImageError, match="sides of at most 100 pixels"):
        read_image(_encode(Image.new("RGB", (101, 3)), "PNG"), max_side=100)


@pytest.fixture()
def budget():
    """The process-wide decode budget, restored after the test."""
    from vitviz.data import images

    before = (images.DECODE_BUDGET.total, images.DECODE_BUDGET.wait_s)
    yield images.DECODE_BUDGET
    images.DECODE_BUDGET.resize(*before)


def test_decoding_is_bounded_for_the_whole_process(budget, monkeypatch):
    """Issue 23.3: the bound was per session; now every thread (session) shares one byte budget."""
    import threading
    import time

    from vitviz.data import images

    img = _encode(Image.new("RGB", (300, 200), (10, 20, 30)), "PNG")
    cost = images.decode_cost((300, 200), "RGB")
    assert cost == 300 * 200 * 20
    budget.resize(2 * cost, wait_s=30)
    real, inside, most = images._to_rgb, [0], [0]
    lock = threading.Lock()

    def slow(im, notes):  # hold the budget a while, count decodes running at once
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        with lock:
            inside[0] -= 1
        return real(im, notes)

    monkeypatch.setattr(images, "_to_rgb", slow)
    out = []
    threads = [threading.Thread(target=lambda: out.append(read_image(img).image.size)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [(300, 200)] * 8
    assert most[0] == 2 and budget.used == 0 and budget.peak <= 2 * cost


def test_a_full_budget_makes_others_wait_then_refuses(budget):
    """What another session holds counts here too (a page reload starts no new budget)."""
    from vitviz.data import images

    img = _encode(Image.new("RGB", (300, 200)), "PNG")
    cost = images.decode_cost((300, 200), "RGB")
    budget.resize(cost + cost // 2, wait_s=0.2)
    budget.reserve(cost)  # another session is decoding
    try:
        with pytest.raises(ImageError, match="busy decoding other large images"):
            read_image(img)
    finally:
        budget.release(cost)
    assert read_image(img).image.size == (300, 200)
    budget.resize(cost - 1)
    with pytest.raises(ImageError, match=r"would take about 1 MB of memory; this server decodes at most 1 MB"):
        read_image(img)
