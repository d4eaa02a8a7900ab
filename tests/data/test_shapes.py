import numpy as np

from vitviz.data.shapes import CLASSES, IMAGE_SIZE, make_sample, write_dataset


def test_same_seed_same_image_and_box():
    a, b = make_sample(42), make_sample(42)
    assert np.array_equal(np.asarray(a.image), np.asarray(b.image)) and a.box == b.box and a.label == b.label
    assert not np.array_equal(np.asarray(a.image), np.asarray(make_sample(43).image))


def test_box_is_tight_around_the_shape():
    for seed in range(20):
        s = make_sample(seed)
        x0, y0, x1, y1 = s.box
        side = max(x1 - x0, y1 - y0)
        assert 0.25 * 96 < side < 0.65 * 96  # much larger than any clutter blob (at most 9 px)
        assert x0 >= 0 and x1 <= 96 and y0 >= 0 and y1 <= 96


def test_every_class_appears_and_labels_are_forced():
    assert {make_sample(s).label for s in range(60)} == set(range(len(CLASSES)))
    assert make_sample(1, label=3).label == 3


def test_write_dataset(tmp_path):
    csv_path = write_dataset(tmp_path, n=3, seed=1)
    assert len(csv_path.read_text().splitlines()) == 4
    assert len(list(tmp_path.glob("*.png"))) == 3


def test_make_sample_returns_the_shapes_own_pixels():
    for seed in range(6):
        s = make_sample(seed)
        assert s.mask.shape == (IMAGE_SIZE, IMAGE_SIZE) and s.mask.dtype == bool
        ys, xs = np.nonzero(s.mask)
        assert (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1) == s.box
        on = np.asarray(s.image)[s.mask]
        assert (on == on[0]).all()  # one fill colour: the shape is drawn last, nothing covers it
        assert make_sample(seed) == s  # the mask does not take part in equality
