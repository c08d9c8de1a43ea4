"""The dataset workbench at scale: N generated images (default 10,000).

Prints, measured in one run on this machine:
  - scan + thumbnail rate of the background indexer (images/s, the pool of processes `dataset index` uses);
  - a second scan with everything cached (the index reused);
  - time until the Datasets page has its first page of the grid: with nothing indexed yet (placeholders,
    the indexer starting behind) and with the index complete;
  - the grid's data the page sends (every filtered image's thumbnail name and label), its time and size;
  - with --browser: the studio in chromium, the time from choosing the dataset to its first page, and
    from a click on "Page ▶" until the new page's label and thumbnails are shown (median of 6; pages
    are drawn in the browser, gui/datasets_grid.py).

    .venv/bin/python bench/dataset_workbench.py [--n 10000] [--browser] [--keep DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gui.datasets_grid import grid_cells, grid_html  # noqa: E402
from gui.datasets_model import PAGE_SIZE, Views  # noqa: E402
from trainer_backend.workbench import CheckSettings, build_index  # noqa: E402


def generate(folder: Path, n: int, side: int = 256) -> float:
    """n distinct JPEGs (random 6×6 colour fields scaled up) with captions; returns seconds."""
    start = time.perf_counter()
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        small = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8), "RGB")
        small.resize((side, side), Image.Resampling.BILINEAR).save(folder / f"img_{i:05d}.jpg", quality=85)
        (folder / f"img_{i:05d}.txt").write_text(f"a photo, pattern {i % 50}, tag{i % 7}")
    return time.perf_counter() - start


def first_page(cache: Path, folder: Path, settings: CheckSettings) -> tuple[float, float, int]:
    """(seconds until the grid's data is ready: the view, every filtered image's thumbnail name and
    label as the page sends them; seconds to make that data again from the kept view; its bytes)."""
    views = Views(cache)
    timings = []
    for _ in range(2):
        start = time.perf_counter()
        view = views.get(folder, settings)
        indices = view.filtered()
        cells = grid_cells(cache, view.items, indices)
        data = grid_html(cache / "thumbs", cells, 0, PAGE_SIZE, str(folder))
        timings.append(time.perf_counter() - start)
    return timings[0], timings[1], len(data.encode())


def browser_page_change(datasets: Path, runs: Path, pages: int) -> list[float]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_browser_studio import CHROMIUM, Server
    from playwright.sync_api import sync_playwright
    server = Server(runs.parent)
    server.start()
    times = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(server.url)
            page.wait_for_selector("#field-model-path", timeout=120_000)
            page.get_by_role("tab", name="Datasets").click()
            page.locator("#ds-choose input").first.click()
            before = time.perf_counter()
            page.get_by_role("option", name="bench", exact=True).click()
            page.wait_for_function("() => /page 1 of/.test((document.querySelector('#ds-page-label') || {}).innerText)",
                                   polling=10)
            print(f"opened in {time.perf_counter() - before:.2f} s (choice to the first page's label): "
                  + page.locator("#ds-page-label").inner_text(), flush=True)
            for k in range(2, min(pages, 8) + 1):
                first = page.locator("#ds-grid img").first.get_attribute("src")
                before = time.perf_counter()
                page.click("#ds-page-next")
                try:
                    page.wait_for_function(f"() => /page {k} of/.test((document.querySelector('#ds-page-label') || {{}})"
                                           f".innerText)", polling=10)
                except Exception:
                    page.screenshot(path=str(runs.parent / "stuck.png"))
                    raise RuntimeError(f"page {k} never came: {page.locator('#ds-page-label').inner_text()!r}, "
                                       f"{page.locator('#ds-message').inner_text()!r}") from None
                labelled = time.perf_counter() - before
                # the visible rows' thumbnails (the gallery loads the rows below lazily, when scrolled to)
                page.wait_for_function("(first) => { const imgs = [...document.querySelectorAll('#ds-grid img')]"
                                       ".slice(0, 30); return imgs.length && imgs[0].getAttribute('src') !== first"
                                       " && imgs.every(i => i.complete && i.naturalWidth > 0); }", arg=first,
                                       polling=10)
                times.append((labelled, time.perf_counter() - before))
            browser.close()
    finally:
        server.stop()
    return times[1:]   # the first change also warms the browser's caches


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--browser", action="store_true", help="also time a page change in chromium")
    ap.add_argument("--keep", default="", help="work in this folder and keep it (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="workbench-bench-"))
    datasets, cache = work / "datasets", work / "datasets" / ".cache"
    folder = datasets / "bench"
    settings = CheckSettings(resolution=512)
    try:
        if not folder.is_dir():
            print(f"generating {args.n} images: {generate(folder, args.n):.1f} s")
        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
        opened, _, _ = first_page(cache, folder, settings)
        print(f"grid data with nothing indexed yet (placeholders): {opened:.2f} s")
        start = time.perf_counter()
        build_index(folder, cache)
        took = time.perf_counter() - start
        print(f"scan + thumbnails: {args.n} images in {took:.1f} s = {args.n / took:.0f} images/s")
        start = time.perf_counter()
        build_index(folder, cache)
        print(f"scan again (index reused): {time.perf_counter() - start:.2f} s")
        opened, again, size = first_page(cache, folder, settings)
        print(f"grid data with the index complete: {opened:.2f} s (view built), {again * 1000:.0f} ms (view kept), "
              f"{size / 1e6:.2f} MB sent to the browser once per dataset/filter/index change")
        if args.browser:
            times = browser_page_change(datasets, work / "runs", -(-args.n // PAGE_SIZE))
            labels, shown = [t[0] for t in times], [t[1] for t in times]
            print(f"page change in chromium, median of {len(times)}: the new page's label {statistics.median(labels) * 1000:.0f} ms, "
                  f"its first 3 rows of thumbnails shown {statistics.median(shown) * 1000:.0f} ms "
                  f"(max {max(shown) * 1000:.0f})")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
