"""The dataset's undo journal (trainer_backend/workbench/journal.py): every caption change is
undoable, previous bytes come back exactly, and refused changes change nothing."""
import os
import re
import threading

import pytest
from hypothesis import given, settings, strategies as st

from trainer_backend.workbench import JournalError, apply, entries, undo


def _texts(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.txt"))}


def test_apply_writes_and_undo_restores_previous_text_and_absence(tmp_path):
    (tmp_path / "a.txt").write_text("a dog", encoding="utf-8")
    (tmp_path / "b.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))  # not UTF-8: must come back byte for byte
    before = _texts(tmp_path)
    entry = apply(tmp_path, {tmp_path / "a.txt": "ohwx, a dog", tmp_path / "b.txt": None,
                             tmp_path / "c.txt": "new caption"}, "trigger word")
    assert (tmp_path / "a.txt").read_text() == "ohwx, a dog"
    assert not (tmp_path / "b.txt").exists()
    assert (tmp_path / "c.txt").read_text() == "new caption"
    assert [e.label for e in entries(tmp_path)] == ["trigger word"]
    undone = undo(tmp_path)
    assert undone.id == entry and undone.undone
    assert _texts(tmp_path) == before  # c.txt (absent before) is gone again, b.txt's latin-1 bytes are back
    with pytest.raises(JournalError, match="nothing to undo"):
        undo(tmp_path)


def test_undo_by_id_and_newest_first(tmp_path):
    first = apply(tmp_path, {"a.txt": "one"}, "first")
    second = apply(tmp_path, {"b.txt": "two"}, "second")
    assert [e.id for e in entries(tmp_path)] == [second, first]
    undo(tmp_path, first)
    assert not (tmp_path / "a.txt").exists() and (tmp_path / "b.txt").read_text() == "two"
    with pytest.raises(JournalError, match="already undone"):
        undo(tmp_path, first)
    assert undo(tmp_path).id == second


def test_undo_refuses_when_a_file_changed_after_the_entry(tmp_path):
    apply(tmp_path, {"a.txt": "ohwx, a dog"}, "bulk")
    (tmp_path / "a.txt").write_text("edited by hand afterwards")
    with pytest.raises(JournalError, match=r"a\.txt: changed after 'bulk'"):
        undo(tmp_path)
    assert (tmp_path / "a.txt").read_text() == "edited by hand afterwards"
    undo(tmp_path, force=True)
    assert not (tmp_path / "a.txt").exists()


def test_expected_text_guards_against_a_second_tab(tmp_path):
    (tmp_path / "a.txt").write_text("a dog")
    apply(tmp_path, {"a.txt": "tab one's caption"}, "edit", expected={"a.txt": "a dog"})
    with pytest.raises(JournalError, match="changed since it was loaded"):
        apply(tmp_path, {"a.txt": "tab two's caption"}, "edit", expected={"a.txt": "a dog"})
    assert (tmp_path / "a.txt").read_text() == "tab one's caption"


def test_paths_outside_the_dataset_are_refused(tmp_path):
    (tmp_path / "ds").mkdir()
    with pytest.raises(JournalError, match="outside the dataset folder"):
        apply(tmp_path / "ds", {tmp_path / "elsewhere.txt": "x"}, "escape")
    with pytest.raises(JournalError, match="outside the dataset folder"):
        apply(tmp_path / "ds", {"../elsewhere.txt": "x"}, "escape")
    assert not (tmp_path / "elsewhere.txt").exists()


def test_a_read_only_folder_changes_nothing():
    """As a user who may not write the folder (a forked child as uid 65534 when the suite runs as root)."""
    from unprivileged import as_writer_without_rights, read_only_place
    with read_only_place() as ds:
        (ds / "a.txt").write_text("a dog")
        apply(ds, {"a.txt": "a cat"}, "make the journal")  # the journal exists; now the folder turns read-only
        kind, message = as_writer_without_rights(ds, lambda: apply(ds, {"a.txt": "a bird"}, "edit"))
        assert kind == "JournalError" and re.search("read-only|not writable", message), (kind, message)
        assert "\n" not in message
        assert (ds / "a.txt").read_text() == "a cat"
        assert len(entries(ds)) == 1


def test_concurrent_writers_each_get_an_entry(tmp_path):
    def write(i):
        apply(tmp_path, {f"{i}.txt": f"caption {i}"}, f"writer {i}")
    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({e.id for e in entries(tmp_path)}) == 8
    for _ in range(8):
        undo(tmp_path)
    assert not list(tmp_path.glob("*.txt"))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a.txt", "b.txt", "c.txt"]), st.one_of(st.none(), st.text(max_size=20))),
                min_size=1, max_size=6))
def test_undoing_every_entry_restores_the_start(tmp_path_factory, edits):
    folder = tmp_path_factory.mktemp("ds")
    (folder / "a.txt").write_text("start")
    start = _texts(folder)
    for name, text in edits:
        apply(folder, {name: text}, "edit")
    while any(not e.undone for e in entries(folder)):
        undo(folder)
    assert _texts(folder) == start
