"""What the Datasets page shows (gui/datasets_model.py, no browser): filters by flag, tag and bucket,
pages, edit pairs flagged (missing or size-mismatched control images), the datasets table, the
crop drawn on the detail picture."""
import numpy as np

from gui.datasets_model import FLAG_LABELS, Views, detail_picture, page_of
from tests.workbench_images import pattern, write_dataset
from trainer_backend.workbench import CheckSettings, build_index


def test_filters_pages_and_edit_pairs(tmp_path):
    folder = tmp_path / "ds"
    write_dataset(folder, 4)
    pattern(20, (192, 96)).save(folder / "wide.png")                       # its own bucket, no caption
    (folder / "img_00001.txt").write_text("ohwx, a dog")
    control = tmp_path / "control"
    control.mkdir()
    pattern(30).save(control / "img_00000.png")                              # same size: fine
    pattern(31, (48, 48)).save(control / "img_00001.png")                    # other size
    cache = tmp_path / "cache"
    build_index(folder, cache)
    settings = CheckSettings(resolution=64, bucketing=True, bucket_step=32)
    view = Views(cache).get(folder, settings, str(control))
    names = lambda idx: [view.items[i]["path"] for i in idx]  # noqa: E731
    assert names(view.filtered("uncaptioned")) == ["wide.png"]
    assert names(view.filtered("", tag="ohwx")) == ["img_00001.png"]
    assert names(view.filtered("", bucket="96x32")) == ["wide.png"] and "64x64" in view.buckets()
    assert names(view.filtered("control_size")) == ["img_00001.png"]
    assert names(view.filtered("control_missing")) == ["img_00002.png", "img_00003.png", "wide.png"]
    assert view.items[0]["controls"] == [str(control / "img_00000.png")]
    # a dataset of edit pairs and plain captions (Qwen-Image 2.1): the unpaired images are caption-only items
    uncontrolled = next(item for item in view.items if item["path"] == "img_00002.png")
    assert uncontrolled["controls"] == [] and "Qwen-Image 2.1" in uncontrolled["flags"]["control_missing"]
    assert "Krea 2" in uncontrolled["flags"]["control_missing"]  # every family that generates and edits
    assert FLAG_LABELS["control_missing"] == "no control image (caption only)"
    shown, page, pages = page_of(list(range(130)), 5, size=60)
    assert (shown[0], len(shown), page, pages) == (120, 10, 2, 3)


def test_the_detail_picture_draws_the_trainers_crop(tmp_path):
    folder = tmp_path / "ds"
    pattern(1, (200, 100)).save(folder.mkdir() or folder / "wide.png")
    build_index(folder, tmp_path / "cache")
    view = Views(tmp_path / "cache").get(folder, CheckSettings(resolution=64))
    picture, text = detail_picture(folder, view.items[0], view.settings)
    assert "200×100 px · bucket 64x64 · the crop keeps 50%" in text and "crop cuts" in text
    arr = np.asarray(picture).astype(int)
    red = (arr[..., 0] > 200) & (arr[..., 1] < 110) & (arr[..., 2] < 110)
    columns = np.nonzero(red.any(axis=0))[0]
    # a centred square of the 2:1 image: the red outline spans the middle half of the width
    assert abs(columns.min() / arr.shape[1] - 0.25) < 0.02 and abs(columns.max() / arr.shape[1] - 0.75) < 0.02
