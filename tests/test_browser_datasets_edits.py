"""The Datasets page's edits in a real browser (Playwright driving Debian's chromium, the helpers of
tests/test_browser_studio.py): two tabs editing one caption (the second save is refused, the first
tab's text stays on disk), and the "Caption with a model" button clicked with the tiny captioner,
its captions then undone from the page."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.test_browser_studio import CHROMIUM, Server, browser, open_page  # noqa: F401
from tests.workbench_images import write_dataset

pytestmark = [pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium not installed"),
              pytest.mark.both_cores]
WAIT_MS = 90_000   # a hang guard for a loaded machine, not a speed check


@pytest.fixture()
def studio(tmp_path):
    srv = Server(tmp_path).start()
    yield srv
    srv.stop()


def open_dataset(browser, url: str, name: str):  # noqa: F811
    """A new tab on the Datasets page with `name` chosen and its grid shown."""
    page = open_page(browser, url)
    page.get_by_role("tab", name="Datasets").click()
    page.locator("#ds-choose input").first.click()
    page.get_by_role("option", name=name, exact=True).click()
    expect(page.locator("#ds-page-label")).to_contain_text("page 1 of", timeout=WAIT_MS)
    return page


def test_two_tabs_the_second_save_is_refused_and_the_first_text_stays(studio, browser, tmp_path):  # noqa: F811
    folder = tmp_path / "datasets" / "dogs"
    write_dataset(folder, 61, size=(32, 32))   # two pages of the grid
    caption_file = folder / "img_00000.txt"
    tabs = [open_dataset(browser, studio.url, "dogs") for _ in range(2)]
    for tab in tabs:
        tab.locator("#ds-grid img").first.click()
        expect(tab.locator("#ds-caption textarea")).to_have_value("a photo, pattern 0", timeout=WAIT_MS)

    first, second = tabs
    first.locator("#ds-caption textarea").fill("a photo, edited in tab one")
    first.click("#ds-save")
    expect(first.locator("#ds-message")).to_contain_text("Saved the caption of img_00000.png", timeout=WAIT_MS)
    assert caption_file.read_text() == "a photo, edited in tab one"

    second.locator("#ds-caption textarea").fill("a photo, edited in tab two")
    second.locator("#ds-caption textarea").press("Control+s")
    expect(second.locator("#ds-message")).to_contain_text("changed since it was loaded", timeout=WAIT_MS)
    assert "img_00000.txt" in second.locator("#ds-message").inner_text()
    assert caption_file.read_text() == "a photo, edited in tab one"
    # the refused text is still in the second tab's box: nothing the user typed is lost
    assert second.locator("#ds-caption textarea").input_value() == "a photo, edited in tab two"

    # the grid's pages are drawn in the browser; a thumbnail on page 2 opens that image
    expect(first.locator("#ds-page-label")).to_contain_text("page 1 of 2 (61 shown", timeout=WAIT_MS)
    first.click("#ds-page-next")
    expect(first.locator("#ds-page-label")).to_contain_text("page 2 of 2", timeout=WAIT_MS)
    assert first.locator("#ds-grid img").count() == 1
    first.locator("#ds-grid img").first.click()
    expect(first.locator("#ds-info")).to_contain_text("img_00060.png", timeout=WAIT_MS)
    expect(first.locator("#ds-caption textarea")).to_have_value("a photo, pattern 60", timeout=WAIT_MS)
    # Alt+← past the page's start: the detail shows image 59 and the grid follows it to page 1, marked
    first.locator("#ds-caption textarea").press("Alt+ArrowLeft")
    expect(first.locator("#ds-info")).to_contain_text("img_00059.png", timeout=WAIT_MS)
    expect(first.locator("#ds-page-label")).to_contain_text("page 1 of 2", timeout=WAIT_MS)
    expect(first.locator("#ds-grid .ds-cell.selected")).to_have_attribute("data-pos", "59", timeout=WAIT_MS)
    first.click("#ds-next")
    expect(first.locator("#ds-page-label")).to_contain_text("page 2 of 2", timeout=WAIT_MS)


@pytest.mark.slow   # the tiny captioner's job process: ~20-40 s on 2 cores with the studio and chromium
def test_caption_button_clicked_writes_captions_and_undo_restores(studio, browser, tmp_path):  # noqa: F811
    folder = tmp_path / "datasets" / "dogs"
    write_dataset(folder, 2, caption=False)
    (folder / "img_00000.txt").write_text("my own caption")
    page = open_dataset(browser, studio.url, "dogs")
    page.get_by_text("Caption with a model").click()
    page.locator("#ds-cap-model textarea, #ds-cap-model input").first.fill("builtin:tiny-caption-florence2")
    page.locator("#ds-cap-trigger textarea, #ds-cap-trigger input").first.fill("ohwx")
    page.click("#ds-cap-start")
    expect(page.locator("#ds-message")).to_contain_text("Started captioning", timeout=WAIT_MS)
    expect(page.locator("#ds-cap-status")).to_contain_text("done", timeout=240_000)
    assert "1/1 images" in page.locator("#ds-cap-status").inner_text()   # the captioned one was skipped
    assert (folder / "img_00001.txt").read_text().startswith("ohwx")
    assert (folder / "img_00000.txt").read_text() == "my own caption"

    page.click("#ds-undo")
    expect(page.locator("#ds-bulk-plan textarea")).to_have_value(re.compile("Undone"), timeout=WAIT_MS)
    assert not (folder / "img_00001.txt").exists()
    assert (folder / "img_00000.txt").read_text() == "my own caption"
