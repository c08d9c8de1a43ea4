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
