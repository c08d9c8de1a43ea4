"""The Datasets page in a real browser (Playwright driving Debian's chromium, as
tests/test_browser_studio.py): create a dataset, upload images, the duplicate pair found, the
crop preview drawn, a caption edited with the keyboard, a bulk trigger word applied and undone,
and "Train on this dataset" filling the Training form."""
from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.test_browser_studio import (CHROMIUM, Server, browser, field_input, open_page, shot,  # noqa: F401
                                       wait_text)
from tests.workbench_images import pattern

pytestmark = [pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium not installed"),
              pytest.mark.both_cores]


@pytest.fixture()
def studio(tmp_path):
    srv = Server(tmp_path).start()
    yield srv
    srv.stop()


def _uploads(folder: Path) -> list[str]:
    folder.mkdir()
    for i in range(3):
        pattern(i, (96, 72)).save(folder / f"img{i}.png")
        (folder / f"img{i}.txt").write_text(f"a pattern, number {i}")
    (folder / "copy0.png").write_bytes((folder / "img0.png").read_bytes())
    return sorted(str(p) for p in folder.iterdir())


def wait_value(page, selector: str, pattern: str, timeout_s: float) -> str:
    """Poll a textbox's value until it matches."""
    deadline, value = time.time() + timeout_s, ""
    while time.time() < deadline:
        value = page.locator(f"{selector} textarea").first.input_value()
        if re.search(pattern, value):
            return value
        time.sleep(0.3)
    raise AssertionError(f"{selector}: {pattern!r} did not appear in {timeout_s} s; last value: {value!r}")


def _red_pixels(png: bytes) -> int:
    import io
    arr = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    return int(((arr[..., 0] > 200) & (arr[..., 1] < 110) & (arr[..., 2] < 110)).sum())


def test_datasets_page_upload_caption_bulk_undo_duplicates_crop(studio, browser, tmp_path):  # noqa: F811
    started = time.time()
    marks = []

    def mark(what):
        marks.append(f"{what} {time.time() - started:.1f}s")
    page = open_page(browser, studio.url)
    mark("page")
    page.get_by_role("tab", name="Datasets").click()
    page.get_by_text("Add images").click()
    page.locator("#ds-new-name textarea, #ds-new-name input").first.fill("dogs")
    page.click("#ds-create")
    wait_text(page, "#ds-message", r"Created", 60)
    dataset = tmp_path / "datasets" / "dogs"
    mark("created")
    assert (dataset / ".workbench" / "dataset.json").is_file()

    # upload: files land in the dataset; the grid and the summary follow, duplicates found
    page.locator("#ds-upload input[type=file]").set_input_files(_uploads(tmp_path / "upload"))
    wait_text(page, "#ds-message", r"Added 4 images", 90)
    assert sorted(p.name for p in dataset.glob("*.png")) == ["copy0.png", "img0.png", "img1.png", "img2.png"]
    summary = wait_text(page, "#ds-summary", r"1 duplicate groups", 120)
    assert "4 images" in summary and "3 captioned" in summary
    assert page.locator("#ds-grid img").count() == 4
    shot(page, "datasets-grid")
    mark("grid")

    # the duplicate pair, side by side: filter, click one, its partner is shown
    page.locator("#ds-filter input").first.click()
    page.get_by_role("option", name="exact duplicate", exact=True).click()
    wait_text(page, "#ds-page-label", r"\(2 shown", 60)
    page.locator("#ds-grid img").first.click()
    wait_text(page, "#ds-info", r"exact duplicate", 60)
    page.wait_for_selector("#ds-partner img")
    mark("dup")

    # the crop preview: a 96×72 image at a 64 px square bucket: the red rectangle is drawn
    page.locator("#ds-filter input").first.click()
    page.get_by_role("option", name="all images", exact=True).click()
    wait_text(page, "#ds-page-label", r"\(4 shown", 60)
    page.locator("#ds-grid img").nth(1).click()          # img0.png (sorted: copy0, img0, img1, img2)
    info = wait_text(page, "#ds-info", r"img0\.png", 60)
    assert "bucket" in info and "the crop keeps" in info
    page.wait_for_selector("#ds-picture img")
    assert _red_pixels(page.locator("#ds-picture img").first.screenshot()) > 50
    shot(page, "datasets-detail")
    mark("crop")

    # caption editor: type, Ctrl+S saves (journaled), Alt+→ goes to the next image
    box = page.locator("#ds-caption textarea").first
    assert box.input_value() == "a pattern, number 0"
    box.fill("a pattern, number zero")
    box.press("Control+s")
    wait_text(page, "#ds-message", r"Saved the caption of img0\.png", 60)
    assert (dataset / "img0.txt").read_text() == "a pattern, number zero"
    box.press("Alt+ArrowRight")
    wait_text(page, "#ds-info", r"img1\.png", 60)
    mark("caption")

    # bulk: trigger word with a preview, applied, then undone
    page.locator("#ds-bulk-text textarea, #ds-bulk-text input").first.fill("ohwx")
    page.click("#ds-bulk-preview")
    wait_value(page, "#ds-bulk-plan", r"4 caption files would change", 60)
    assert (dataset / "img1.txt").read_text() == "a pattern, number 1"   # a preview writes nothing
    page.click("#ds-bulk-apply")
    wait_value(page, "#ds-bulk-plan", r"Applied: prepend 'ohwx'", 60)
    assert (dataset / "img1.txt").read_text() == "ohwx, a pattern, number 1"
    assert (dataset / "copy0.txt").read_text() == "ohwx"
    page.click("#ds-undo")
    wait_value(page, "#ds-bulk-plan", r"Undone: prepend 'ohwx'", 60)
    assert (dataset / "img1.txt").read_text() == "a pattern, number 1" and not (dataset / "copy0.txt").exists()
    assert (dataset / "img0.txt").read_text() == "a pattern, number zero"
    mark("bulk")

    # Train on this dataset: the Training form's dataset.path
    page.click("#ds-train")
    page.get_by_role("tab", name="Dataset", exact=True).click()
    deadline = time.time() + 60
    while field_input(page, "dataset", "path").input_value() != str(dataset.resolve()) and time.time() < deadline:
        time.sleep(0.3)
    assert field_input(page, "dataset", "path").input_value() == str(dataset.resolve())
    mark("train")
    print("; ".join(marks))
