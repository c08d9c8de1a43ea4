"""Issue 16 in a real browser, Training page: the inspector drops a previous folder's views and says
why files were skipped (1), a confirmation does not outlive its moment (2), headings keep their whole
docstring (6), labels, the visible command preview and captions (22); a reload keeps the form's edits
(8). The Run-page items (2, 3, 20, 22) share the demo run of test_browser_studio.py."""
from __future__ import annotations

# pytestmark: skipped without chromium, and run on the browser tests' one xdist worker
from test_browser_studio import browser, field_input, open_page, pytestmark, server, shot, wait_text  # noqa: F401

def test_training_page_inspector_messages_and_labels(server, browser, tmp_path):  # noqa: F811
    page = open_page(browser, server.url)
    # 22: words next to the TOML key; the command preview is on the page, not behind a tab
    page.get_by_role("tab", name="Optimizer & schedule").click()
    assert "Batch size · batch_size" in page.locator("#field-schedule-batch_size").inner_text()
    assert page.locator("#cmd-shell").is_visible()
    wait_text(page, "#cmd-shell", r"trainer_backend", 60)
    # 6: a heading keeps its whole first paragraph
    page.get_by_role("tab", name="Checkpoints & cloud").click()
    assert "in the background" in page.locator("#section-cloud").inner_text()

    # 1: the demo folder's thumbnails, captioned with the file name's end
    page.get_by_role("tab", name="Dataset").click()
    wait_text(page, "#inspect-summary", r"\d+ images", 90)
    page.wait_for_function("() => document.querySelectorAll('#thumbs img').length > 0", timeout=30_000)
    assert any("." in t for t in page.locator("#thumbs").inner_text().split()), page.locator("#thumbs").inner_text()
    bad = tmp_path / "all-broken"
    bad.mkdir()
    for i in range(7):
        (bad / f"photo_{i:03d}.png").write_text("not an image")
    path = field_input(page, "dataset", "path")
    path.fill(str(bad))
    path.press("Tab")
    text = wait_text(page, "#inspect-summary", r"files skipped", 90)
    assert "7 files skipped" in text and "photo_000.png" in text and "… and 2 more" in text, text
    assert "see the warnings above" not in text
    page.wait_for_function("() => document.querySelectorAll('#thumbs img').length === 0", timeout=30_000)
    shot(page, "issue16-inspector-all-skipped")
    path.fill("/no/such/folder")
    path.press("Tab")
    wait_text(page, "#inspect-summary", r"not a folder|does not exist", 60)

    # 2: "press Delete again within 10 s" goes when the 10 s are over
    page.locator("#preset-name input, #preset-name textarea").first.fill("to delete")
    page.click("#preset-save-as")
    wait_text(page, "#preset-message", r"Saved", 20)
    page.click("#preset-delete")
    wait_text(page, "#preset-message", r"again within 10 s", 20)
    page.wait_for_function("() => !document.querySelector('#preset-message').innerText.includes('again')",
                           timeout=60_000)   # 10 s, plus a hang guard for a loaded machine
    assert (server.presets / "to delete.toml").exists()

    # 8: a reload keeps the form's edits, and the page says what differs from the preset
    page.get_by_role("tab", name="Model", exact=True).click()
    name = field_input(page, "output", "name")
    name.fill("kept-after-reload")
    name.press("Tab")
    wait_text(page, "#form-modified", r"from preset.*output\.name", 30)
    page.reload()
    page.wait_for_selector("#field-model-path", timeout=90_000)
    page.get_by_role("tab", name="Model", exact=True).click()
    page.wait_for_function("() => { const e = document.querySelector('#field-output-name input, "
                           "#field-output-name textarea'); return e && e.value === 'kept-after-reload'; }",
                           timeout=30_000)
    wait_text(page, "#form-modified", r"output\.name", 30)
    assert page.locator("#preset-select input").first.input_value() == "to delete"
    assert not page.locator(".toast-body, .toast-wrap").filter(has_text="Error").count(), "an error toast"
    shot(page, "issue16-form-after-reload")
