"""Reading evaluation data sets: folders and CSVs, with bad files reported, skipped and counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitviz.data.shapes import write_dataset
from vitviz.errors import ImageError
from vitviz.evaluate.data import DataError, Item, load_item, read_dataset, scale_box


def _png(path: Path, w: int = 40, h: int = 30) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return path


def _truncated(path: Path) -> Path:
    good = _png(path.with_name("full_" + path.name), 64, 64).read_bytes()
    path.write_bytes(good[: len(good) // 2])
    path.with_name("full_" + path.name).unlink()
    return path


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    _png(root / "b.png")
    _png(root / "a.JPG")  # an upper-case suffix counts
    (root / "sub").mkdir()
    Image.new("RGB", (20, 20)).save(root / "sub" / "c.webp")
    (root / "notes.txt").write_text("not an image")
    (root / ".hidden.png").write_text("ignored: hidden")
    (root / ".work").mkdir()
    _png(root / ".work" / "x.png")  # hidden folders are ignored too (e.g. a results work folder)
    (root / "fake.png").write_text("text pretending to be a PNG")
    _truncated(root / "broken.png")
    return root


def test_folder_lists_images_sorted_recursively_and_skips_non_images(folder: Path) -> None:
    ds = read_dataset(folder)
    assert ds.kind == "folder"
    assert [i.image_id for i in ds.items] == ["a.JPG", "b.png", "broken.png", "fake.png", "sub/c.webp"]
    assert [Path(s.where).name for s in ds.skipped] == ["notes.txt"]
    assert "not an image file" in ds.skipped[0].reason
    assert all(i.box is None and i.label is None for i in ds.items)


def test_folder_limit_and_unreadable_images_fail_per_item(folder: Path) -> None:
    ds = read_dataset(folder, limit=2)
    assert len(ds.items) == 2
    items = {i.image_id: i for i in read_dataset(folder).items}
    assert load_item(items["b.png"]).size == (40, 30)
    with pytest.raises(ImageError, match="not an image"):
        load_item(items["fake.png"])
    with pytest.raises(ImageError, match="damaged or truncated"):
        load_item(items["broken.png"])


def test_not_a_dataset(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        read_dataset(tmp_path / "nothing")
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(DataError, match=r"not a \.csv"):
        read_dataset(tmp_path / "x.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no image files"):
        read_dataset(tmp_path / "empty")
    with pytest.raises(DataError, match="--limit"):
        read_dataset(tmp_path, limit=0)


def test_demo_csv_reads_labels_and_boxes(tmp_path: Path) -> None:
    csv_path = write_dataset(tmp_path / "demo", n=3, seed=11)
    ds = read_dataset(csv_path)
    assert ds.kind == "csv" and ds.has_labels and ds.has_boxes and not ds.skipped
    rows = csv_path.read_text().splitlines()[1:]
    for item, row in zip(ds.items, rows, strict=True):
        name, label, *box = row.split(",")
        assert item.image_id == name and item.label == label
        assert item.box == tuple(float(v) for v in box)
        assert Path(item.path) == tmp_path / "demo" / name
        assert load_item(item).size == (96, 96)
    assert ds.items[1].source == "labels.csv:3"


@pytest.mark.parametrize(
    ("header", "missing"),
    [
        ("path,label,x0,y0,x1,y1", "file"),
        ("file,label,x0,y0", "x1, y1"),
        ("label,x0", "file, y0, x1, y1"),
    ],
)
def test_csv_missing_columns_named(tmp_path: Path, header: str, missing: str) -> None:
    p = tmp_path / "labels.csv"
    p.write_text(header + "\n")
    with pytest.raises(DataError) as err:
        read_dataset(p)
    msg = str(err.value)
    assert f"lacks the column{'s' if ',' in missing else ''} {missing}" in msg
    assert "file,label,x0,y0,x1,y1" in msg


def test_csv_bad_rows_are_skipped_counted_and_explained(tmp_path: Path) -> None:
    _png(tmp_path / "ok.png", 40, 30)
    _png(tmp_path / "sub" / "ok2.png", 40, 30)
    (tmp_path / "labels.csv").write_text(
        "\ufefffile, label ,x0,y0,x1,y1\n"  # a BOM and spaces in the header are fine
        "ok.png,cat,1,2,30,20\n"
        "missing.png,cat,1,2,3,4\n"
        "ok.png,cat,1,2,30,20\n"  # listed twice
        "sub/ok2.png,dog,one,2,3,4\n"
        "sub/ok2.png,dog,5,5,5,9\n"  # empty box
        "sub/ok2.png,dog,1,,3,4\n"  # incomplete box
        "\n"
        "sub/ok2.png,,,,,\n"  # no label, no box: fine
        ",dog,1,2,3,4\n"
        "ok.png,cat,1,2,3,4,extra\n"
    )
    ds = read_dataset(tmp_path / "labels.csv")
    assert [i.image_id for i in ds.items] == ["ok.png", "sub/ok2.png"]
    assert ds.items[1].label is None and ds.items[1].box is None
    reasons = {s.where: s.reason for s in ds.skipped}
    assert len(ds.skipped) == 7
    assert "no such file" in reasons["labels.csv:3"] and "missing.png" in reasons["labels.csv:3"]
    assert "listed again (first at labels.csv:2)" in reasons["labels.csv:4"]
    assert reasons["labels.csv:5"] == "x0 = 'one' is not a number"
    assert "is empty" in reasons["labels.csv:6"]
    assert "incomplete: y0 empty" in reasons["labels.csv:7"]
    assert "file cell is empty" in reasons["labels.csv:10"]
    assert "7 cells, the header 6" in reasons["labels.csv:11"]


def test_csv_without_box_columns_and_limit(tmp_path: Path) -> None:
    for k in range(4):
        _png(tmp_path / f"{k}.png")
    (tmp_path / "l.csv").write_text("file\n" + "".join(f"{k}.png\n" for k in range(4)))
    ds = read_dataset(tmp_path / "l.csv", limit=3)
    assert not ds.has_boxes and not ds.has_labels
    assert [i.image_id for i in ds.items] == ["0.png", "1.png", "2.png"]


def test_box_outside_the_image_fails_at_load(tmp_path: Path) -> None:
    _png(tmp_path / "ok.png", 40, 30)
    (tmp_path / "labels.csv").write_text("file,label,x0,y0,x1,y1\nok.png,cat,0,0,41,30\nok.png,cat,0,0,40,30\n")
    ds = read_dataset(tmp_path / "labels.csv")
    with pytest.raises(DataError, match=r"box \(0, 0, 41, 30\) lies outside the 40 x 30 image"):
        load_item(ds.items[0])
    assert ds.skipped[0].reason.startswith("'ok.png' is listed again")


def test_scale_box_follows_the_whole_image_resize() -> None:
    # 200 x 100 (w x h) image resized to a 96 x 48 (h x w) input: x scales by 48/200, y by 96/100
    assert scale_box((50, 10, 150, 90), (200, 100), (96, 48)) == pytest.approx((12, 9.6, 36, 86.4))


def test_item_round_trip() -> None:
    item = Item("a/b.png", "/x/a/b.png", "cat", (1.0, 2.0, 3.0, 4.0), "labels.csv:2")
    assert Item.from_dict(item.to_dict()) == item


# --- the folder's listing is bounded ---------------------------------------------------------------------------


def test_a_folder_of_many_files_is_listed_up_to_max_files_and_says_how_many_were_not(tmp_path: Path) -> None:
    from vitviz.evaluate.data import MAX_FILES, read_dataset

    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(3000):  # empty files: nothing is read while listing
        (folder / f"{i:05d}.png").touch()
    ds = read_dataset(folder, max_files=100)
    assert len(ds.items) == 100  # each entry listed was taken (they are decoded later, per image)
    notes = [str(e) for e in ds.skipped.noted]
    assert len(notes) == 1, notes
    assert "the listing stopped at 100 entries" in notes[0] and "2,900 more in" in notes[0], notes[0]
    assert "evaluate --max-files N lists more" in notes[0]
    assert MAX_FILES == 1_000_000  # the documented default (docs/serving.md, evaluate --help)
    assert len(read_dataset(folder).items) == 3000  # under the default everything is listed, as before


def test_a_deeply_nested_folder_is_listed_without_recursion_and_within_max_files(tmp_path: Path) -> None:
    from vitviz.evaluate.data import read_dataset

    root = tmp_path / "deep"
    here = root
    for depth in range(400):  # deeper than a recursive walk of 2 frames a level could go with the default limit
        here = here / "d"
        here.mkdir(parents=True)
        (here / f"{depth:03d}.png").touch()
    ds = read_dataset(root)
    assert len(ds.items) == 400 and ds.items[-1].image_id.count("/") == 400
    capped = read_dataset(root, max_files=50)  # a folder and a file a level: 25 levels listed
    assert len(capped.items) == 25, len(capped.items)
    (note,) = capped.skipped.noted
    assert "the listing stopped at 50 entries" in note.reason and "1 more in" in note.reason, note.reason


def test_links_to_folders_are_not_followed_and_a_link_loop_does_not_hang(tmp_path: Path) -> None:
    import signal

    from vitviz.evaluate.data import read_dataset

    root = tmp_path / "loops"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.png").touch()
    (root / "a" / "up").symlink_to(root, target_is_directory=True)  # a loop through the parent
    (root / "self").symlink_to(root / "self")  # a link to itself (ELOOP)
    (root / "p.png").symlink_to(root / "q.png")
    (root / "q.png").symlink_to(root / "p.png")  # two links to each other
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError("the listing hung")))
    signal.alarm(20)
    try:
        ds = read_dataset(root)
    finally:
        signal.alarm(0)
    assert [it.image_id for it in ds.items] == ["a/x.png"]
    reasons = {Path(e.where).name: e.reason for e in ds.skipped}
    assert reasons["up"] == "a link to a folder: not followed"
    assert reasons["p.png"].startswith("cannot be read") and reasons["q.png"].startswith("cannot be read")
    assert "self" in reasons  # not an image file (a dangling loop), reported, never followed


def test_max_files_below_one_is_a_clear_error(tmp_path: Path) -> None:
    from vitviz.evaluate.data import DataError, read_dataset

    with pytest.raises(DataError, match="--max-files must be at least 1, got 0"):
        read_dataset(tmp_path, max_files=0)
