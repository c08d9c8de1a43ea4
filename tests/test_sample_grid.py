"""The sample grid (issue 33 item 1, issue 29 item 7): rows = prompts, columns = steps, from the sample events;
the HTML the browser's script pages through (one page of columns shown, newest first)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from gui.sample_grid import grid_html, grid_of, thumbnail


def fake_run(root: Path, name: str, steps: int, prompts: int, size: int = 32, extra: list[dict] = ()) -> Path:
    """A finished run's folder as the trainer leaves it: sample events and their PNGs."""
    run = root / name
    (run / "samples").mkdir(parents=True)
    (run / ".sd-studio-run").write_text("sd-training-studio run\n")
    (run / "config.toml").write_text(f'[output]\nname = "{name}"\n')
    events = [{"event": "plan", "time": 1.0, "num_processes": 1}]
    for s in range(1, steps + 1):
        paths = []
        for p in range(prompts):
            path = run / "samples" / f"step-{s:08d}_p{p:02d}.png"
            Image.new("RGB", (size, size), ((s * 2) % 256, (p * 25) % 256, 128)).save(path)
            paths.append(str(path))
        events.append({"event": "sample", "time": 1.0 + s, "step": s, "epoch": 1, "paths": paths,
                       "prompts": [f"prompt {p}" for p in range(prompts)], "ema": False})
    events += list(extra)
    events.append({"event": "done", "time": 500.0, "step": steps, "outputs": []})
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


def test_grid_rows_are_prompts_columns_steps_and_strengths(tmp_path):
    strength = {"event": "sample", "time": 400.0, "step": 3, "strength": 0.75, "source": "my.safetensors",
                "paths": ["samples/lora-my_s0.75_p01.png"], "rows": [1], "prompts": ["prompt 1"]}
    run = fake_run(tmp_path, "r", steps=3, prompts=2, extra=[strength])
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    grid = grid_of(run, [e for e in events if e["event"] == "sample"])
    assert grid.prompts == ["prompt 0", "prompt 1"]
    assert grid.columns == ["step 1", "step 2", "step 3", "my.safetensors ×0.75"]
    assert grid.cells[(1, 3)] == str(run / "samples" / "lora-my_s0.75_p01.png") and (0, 3) not in grid.cells
    html = grid_html(grid, per_page=2)
    assert html.count("<tr>") == 3 and "data-pages='2'" in html and "data-page='1'>" in html  # newest page first


def test_thumbnails_are_small_and_made_once(tmp_path):
    big = tmp_path / "samples" / "step-00000001_p00.png"
    big.parent.mkdir()
    Image.new("RGB", (1024, 768), (10, 20, 30)).save(big)
    thumb = Path(thumbnail(str(big)))
    assert thumb.parent.name == ".thumbs" and max(Image.open(thumb).size) == 192
    made = thumb.stat().st_mtime_ns
    assert thumbnail(str(big)) == str(thumb) and thumb.stat().st_mtime_ns == made
    small = tmp_path / "small.png"
    Image.new("RGB", (64, 64)).save(small)
    assert thumbnail(str(small)) == str(small)


def test_a_video_sample_is_a_video_cell(tmp_path):
    run = tmp_path / "r"
    grid = grid_of(run, [{"event": "sample", "step": 5, "paths": ["samples/step-00000005_p00.mp4"], "prompts": ["a"]}])
    html = grid_html(grid)
    assert "<video" in html and "step-00000005_p00.mp4" in html and "<img loading" not in html


@pytest.mark.both_cores
def test_grid_in_the_browser_at_100_steps_by_10_prompts(tmp_path):
    """The Runs page opens the newest run: one page of 10 x 10 thumbnails loaded, keys move, Enter shows full size."""
    import time
    from test_browser_studio import CHROMIUM, Server
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium not installed")
    from playwright import sync_api
    srv = Server(tmp_path)
    fake_run(srv.runs, "grid-run", steps=100, prompts=10)
    srv.start()
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(srv.url)
            page.get_by_role("tab", name="Runs").click()
            grid = page.locator("#runs-samples .sample-grid")
            grid.wait_for(timeout=90_000)
            assert grid.locator("tbody tr").count() == 10 and grid.locator("thead th").count() == 101
            assert page.locator("#runs-samples .grid-page").inner_text() == "page 10 / 10"
            deadline = time.time() + 20  # only the shown page's 10 x 10 thumbnails are requested
            while time.time() < deadline and page.locator("#runs-samples img[src]").count() < 100:
                time.sleep(0.2)
            assert page.locator("#runs-samples img[src]").count() == 100
            cell = grid.locator("td[data-row='0'][data-col='99']")
            cell.click()  # selects and opens full size
            assert grid.locator(".grid-full").is_visible()
            assert "step-00000100_p00.png" in grid.locator(".grid-full img").get_attribute("src")
            page.keyboard.press("Escape")
            page.keyboard.press("ArrowDown")
            page.keyboard.press("ArrowLeft")
            selected = grid.locator("td.selected")
            assert (selected.get_attribute("data-row"), selected.get_attribute("data-col")) == ("1", "98")
            page.keyboard.press("Enter")
            assert "step-00000099_p01.png" in grid.locator(".grid-full img").get_attribute("src")
            page.keyboard.press("Escape")
            page.keyboard.press("PageUp")
            assert page.locator("#runs-samples .grid-page").inner_text() == "page 9 / 10"
            browser.close()
    finally:
        srv.stop()
