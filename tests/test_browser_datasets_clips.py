"""Clips on the Datasets page in a real browser (Playwright driving Debian's chromium, the helpers of
tests/test_browser_studio.py): with the Training form's model a video family, a folder of generated
clips shows each clip's first-frame thumbnail labelled with its duration, the summary gives the clips
scan's lines, and clicking a clip shows its windows' frame strip and plays its preview; the Training
page's dataset inspector shows the clip lines and the clips' first frames."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from tests.test_browser_studio import (CHROMIUM, Server, browser, field_input, open_page, shot,  # noqa: F401
                                       wait_text)
from tests.video_clips import make_clip_dataset, moving_square
from trainer_backend.data.video import write_clip

pytestmark = [pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium not installed"),
              pytest.mark.both_cores]
WAIT_MS = 90_000   # a hang guard for a loaded machine, not a speed check


@pytest.fixture()
def studio(tmp_path):
    folder = make_clip_dataset(tmp_path / "datasets" / "walks", n=2, size=32, frames=9)
    write_clip(folder / "long.mp4", moving_square(25, 48, seed=5), fps=16)
    (folder / "long.txt").write_text("a long walk")
    srv = Server(tmp_path).start()
    yield srv
    srv.stop()


def test_clip_thumbnails_labels_summary_the_clip_shown_and_the_inspector(studio, browser):  # noqa: F811
    page = open_page(browser, studio.url)
    model = field_input(page, "model", "path")
    model.fill("builtin:tiny-wan22_t2v")   # a video family: the Datasets page shows its windows
    model.press("Tab")
    page.get_by_role("tab", name="Datasets").click()
    page.locator("#ds-choose input").first.click()
    page.get_by_role("option", name="walks", exact=True).click()

    summary = page.locator("#ds-summary")
    expect(summary).to_contain_text("3 clips ·", timeout=WAIT_MS)
    expect(summary).to_contain_text("clips: 3 (3 videos", timeout=WAIT_MS)
    expect(summary).to_contain_text("windows: 3 (head, 4k+1 frames at 16 fps)", timeout=WAIT_MS)
    cells = page.locator("#ds-grid figure")
    expect(cells.nth(0)).to_contain_text("clip000.mp4 ▶ 0.6 s, 9 f", timeout=WAIT_MS)
    expect(cells.nth(2)).to_contain_text("long.mp4 ▶ 1.6 s, 25 f")
    # the thumbnails are the clips' first frames, made by the background indexer (not placeholders)
    first = page.locator("#ds-grid figure img").first
    expect(first).to_have_attribute("src", re.compile(r"thumbs/.+/[0-9a-f]{64}\.jpg"), timeout=WAIT_MS)
    page.wait_for_function("() => { const i = document.querySelector('#ds-grid figure img');"
                           " return i && i.complete && i.naturalWidth > 0; }", timeout=WAIT_MS)
    shot(page, "datasets-clips-grid")

    cells.nth(2).click()   # long.mp4: one 25-frame window at the default settings (head)
    info = page.locator("#ds-info")
    expect(info).to_contain_text("long.mp4", timeout=WAIT_MS)
    expect(info).to_contain_text("25 frames at 16 fps")
    expect(info).to_contain_text("1 window of 25 frames (head, 4k+1 at 16 fps), frame bucket")
    expect(page.locator("#ds-caption textarea")).to_have_value("a long walk")
    page.wait_for_selector("#ds-picture img", timeout=WAIT_MS)   # the windows' frame strip
    video = page.locator("#ds-clip video")
    expect(video).to_have_attribute("src", re.compile(r"\.mp4"), timeout=WAIT_MS)
    # the browser reads the preview: 25 frames at 16 fps
    page.wait_for_function("() => { const v = document.querySelector('#ds-clip video');"
                           " return v && v.readyState >= 1 && v.duration > 1.4 && v.duration < 1.8; }",
                           timeout=WAIT_MS)
    shot(page, "datasets-clip-detail")

    # the Training page's inspector on the same folder, for the same family
    page.get_by_role("tab", name="Training", exact=True).click()
    page.get_by_role("tab", name="Dataset", exact=True).click()
    path = field_input(page, "dataset", "path")
    path.fill(str(studio.tmp / "datasets" / "walks"))
    path.press("Tab")
    text = wait_text(page, "#inspect-summary", r"3 clips \(3 windows\)", 90)
    assert "windows: 3 (head, 4k+1 frames at 16 fps)" in text, text
    expect(page.locator("#thumbs")).to_contain_text("long.mp4 ▶ 1.6 s, 25 f", timeout=WAIT_MS)
    shot(page, "inspector-clips")
