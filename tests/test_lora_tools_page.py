"""The LoRA tools page in a real browser (issue 33 item 11): a LoRA file in the runs folder is found, inspect's
report is shown, and a resize runs as a job of the studio's queue and ends with its output path and file."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from test_lora_tools import make_lora

pytestmark = pytest.mark.both_cores   # the studio, chromium and a tool's process (tests/conftest.py)


def _wait_text(page, selector: str, pattern: str, timeout_s: float) -> str:
    deadline = time.time() + timeout_s
    text = ""
    while time.time() < deadline:
        text = page.locator(selector).inner_text()
        if re.search(pattern, text):
            return text
        time.sleep(0.3)
    raise AssertionError(f"{selector}: no {pattern!r} in {text!r}")


def _pick(page, selector: str, option: str) -> None:
    page.locator(f"{selector} input").first.click()
    page.get_by_role("option", name=option, exact=True).click()


def test_inspect_and_a_resize_job_from_the_page(tmp_path, tiny_models):
    from test_browser_studio import CHROMIUM, Server
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium not installed")
    from playwright import sync_api
    model_dir = tiny_models("sd1")
    srv = Server(tmp_path)
    lora = make_lora(model_dir, srv.runs / "my-run" / "mine.safetensors", rank=4)
    srv.start()
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            page.goto(srv.url)
            page.get_by_role("tab", name="LoRA tools").click()
            page.locator("#lora-refresh").click()
            _pick(page, "#lora-inspect-file", str(lora))
            page.locator("#lora-inspect").click()
            report = _wait_text(page, "#lora-inspect-report", r'"ranks"', 120)
            assert '"kohya' in report and '"4": ' in report and "mine.safetensors" in report

            _pick(page, "#lora-files", str(lora))
            page.locator("#lora-base textarea, #lora-base input").first.fill(str(model_dir))
            page.locator("#lora-rank input").first.fill("2")
            page.locator("#lora-out textarea, #lora-out input").first.fill("mine-rank2")
            page.locator("#lora-run-tool").click()
            done = _wait_text(page, "#lora-job-status", r"Done|Failed", 240)
            out = srv.runs / "lora-tools" / "out" / "mine-rank2.safetensors"
            assert "Done" in done and str(out) in done, done
            browser.close()
    finally:
        srv.stop()
    from safetensors import safe_open
    with safe_open(str(out), "pt") as f:
        downs = [f.get_tensor(k) for k in f.keys() if k.endswith("lora_down.weight")]
    assert downs and all(t.shape[0] == 2 for t in downs)


def test_the_job_line_follows_the_folder_and_the_queue(tmp_path):
    """What the page says of a job: its progress, its outputs, and a Stop or a crash the queue saw."""
    import json as _json
    from gui.lora_tools_page import job_text
    job = tmp_path / "job"
    job.mkdir()
    assert job_text(str(job), "waiting") == "Waiting in the queue…"
    events = job / "events.jsonl"
    events.write_text(_json.dumps({"event": "start", "step": 0}) + "\n" +
                      _json.dumps({"event": "step", "step": 3, "total_steps": 8}) + "\n")
    assert job_text(str(job), "running") == "Running… 3/8"
    assert job_text(str(job), "stopped") == "Stopped."
    assert job_text(str(job), "error", "Traceback: MemoryError") == "⚠️ **Failed:** Traceback: MemoryError"
    with open(events, "a") as f:
        f.write(_json.dumps({"event": "done", "step": 8, "outputs": ["/x/out.safetensors"]}) + "\n")
    assert job_text(str(job), "done") == "**Done.** Output:\n- `/x/out.safetensors`"
