"""The dataset workbench's backend: check a dataset, edit its captions (journaled, undoable), and
what the studio's Datasets page shows. The page, the `dataset` CLI and the captioners call these
same functions. Imports no torch.

    entry_id = apply(folder, {folder / "a.txt": "ohwx, a dog"}, "caption edit")   # journal.py
    undo(folder)
"""
from __future__ import annotations

from .journal import Entry, JournalError, apply, entries, undo

__all__ = ["Entry", "JournalError", "apply", "entries", "undo"]
