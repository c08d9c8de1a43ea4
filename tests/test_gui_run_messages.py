"""Item 2: a Run-page message belongs to its run and its moment (pure rules of message_update)."""
from __future__ import annotations

from pathlib import Path

from gui.run_page import message_meta, message_update


def test_messages_go_with_another_run_a_status_change_or_their_ttl():
    a, b = Path("/runs/a"), Path("/runs/b")
    meta = message_meta(a, ttl=30)
    shown, meta = message_update(meta, a, "running")          # first tick: the status the action led to
    assert meta["status"] == "running"
    assert message_update(meta, a, "running")[1] == meta        # same run, same status: it stays
    assert message_update(meta, b, "starting") == ("", None)    # "checkpoint requested" never shows on run b
    assert message_update(meta, a, "stopped") == ("", None)     # "stopping, saving state…" goes when stopped
    assert message_update(meta, a, "running", now=meta["at"] + 31) == ("", None)   # "press again within 10 s"


def test_a_stop_message_goes_when_the_run_has_stopped_even_before_the_page_looked():
    a = Path("/runs/a")
    meta = message_meta(a, ttl=3600, holds=("starting", "running", "stopping"))
    shown, kept = message_update(meta, a, "stopping")
    assert kept == meta                                         # while it saves, the message stays
    # the demo saves in a second: the first tick after the click may already see it stopped
    assert message_update(meta, a, "stopped") == ("", None)
    assert message_update(meta, a, "done") == ("", None)


def test_during_a_start_the_run_page_shows_the_new_run_starting_with_its_buttons_off(tmp_path):
    """Item 3: between Start and the new run's first event the page shows the new run (not the one it
    showed before) as starting, and no button can reach the previous run."""
    import time

    import gradio as gr

    from gui.shared_state import Settings, Studio
    from gui.studio import build_app
    studio = Studio.create(Settings(runs_dir=tmp_path / "runs", presets_dir=tmp_path / "presets"))
    app = build_app(studio)
    tick = next(f.fn for f in app.fns.values() if f.name == "tick")
    studio.manager.pending = ("second-run", time.time())
    out = tick(0, {"run": "/runs/first", "alive": True}, None)
    header, stop, save_now, sample_now, resume, progress = out[0], *out[3:7], out[7]
    assert header == "### Run: second-run"
    assert "starting second-run" in progress
    for button in (stop, save_now, sample_now, resume):
        assert button == gr.update(interactive=False)
    shown = out[-4]
    assert shown == ""        # the buttons act on no run until the new one exists
