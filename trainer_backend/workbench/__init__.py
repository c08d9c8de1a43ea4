"""The dataset workbench's backend: check a dataset, edit its captions (journaled, undoable), and
what the studio's Datasets page shows. The page, the `dataset` CLI and the captioners call these
same functions. Imports no torch.

    entry_id = apply(folder, {folder / "a.txt": "ohwx, a dog"}, "caption edit")   # journal.py
    undo(folder)
"""
from __future__ import annotations

from .checks import CheckSettings, annotate, crop_of, duplicate_groups, report, tag_frequency
from .edits import EditError, Operation, apply_plan, plan_edit, preview, save_caption
from .index import build_index, list_images, read_index, thumb_path
from .journal import Entry, JournalError, apply, entries, undo

__all__ = ["CheckSettings", "EditError", "Entry", "JournalError", "Operation", "annotate", "apply", "apply_plan",
           "build_index", "crop_of", "duplicate_groups", "entries", "list_images", "plan_edit", "preview",
           "read_index", "report", "save_caption", "tag_frequency", "thumb_path", "undo"]
