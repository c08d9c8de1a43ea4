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
