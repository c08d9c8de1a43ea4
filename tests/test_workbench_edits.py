"""Caption edits (trainer_backend/workbench/edits.py) and `dataset edit` / `dataset undo`: trigger
words without duplicates, find and replace (plain and regex), tags removed and renamed, a preview
before writing, every edit undoable, bad input refused with nothing changed."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from trainer_backend.workbench.edits import (EditError, Operation, apply_plan, edit_caption, plan_edit, preview,
                                             save_caption)
from trainer_backend.workbench.journal import undo

ROOT = Path(__file__).resolve().parent.parent
tag = st.text(alphabet="abcdefgh xyz", min_size=1, max_size=8).map(str.strip).filter(bool)


@given(st.lists(tag, max_size=6), tag)
def test_prepending_a_trigger_word_twice_adds_it_once(tags, word):
    caption = ", ".join(tags)
    once = edit_caption(caption, Operation("prepend", word))
    assert edit_caption(once, Operation("prepend", word)) == once
    assert once.split(", ")[0] == word or word in tags


def test_operations_on_one_caption():
    assert edit_caption("a dog, grass", Operation("prepend", "ohwx")) == "ohwx, a dog, grass"
    assert edit_caption("a dog, grass", Operation("append", "ohwx")) == "a dog, grass, ohwx"
    assert edit_caption(None, Operation("prepend", "ohwx")) == "ohwx"
    assert edit_caption("a dog, dog bed", Operation("replace", "dog", "cat")) == "a cat, cat bed"
    assert edit_caption("a dog, 2 dogs", Operation("replace", r"\bdog\b", "cat", regex=True)) == "a cat, 2 dogs"
    assert edit_caption("a dog, grass, sky", Operation("remove_tag", "grass")) == "a dog, sky"
    assert edit_caption("a dog, grass, lawn", Operation("rename_tag", "grass", "lawn")) == "a dog, lawn"


def _dataset(tmp_path):
    for i, caption in enumerate(["a dog", "a dog on grass", None]):
        (tmp_path / f"{i}.png").write_bytes(b"")
        if caption is not None:
            (tmp_path / f"{i}.txt").write_text(caption, encoding="utf-8")
    return ["0.png", "1.png", "2.png"]


def test_plan_preview_apply_undo(tmp_path):
    images = _dataset(tmp_path)
    changes = plan_edit(tmp_path, images, Operation("replace", "dog", "cat"))
    assert [c.path.name for c in changes] == ["0.txt", "1.txt"]
    assert preview(changes).splitlines()[0] == "2 caption files would change"
    assert (tmp_path / "0.txt").read_text() == "a dog"       # planning writes nothing
    apply_plan(tmp_path, changes, "replace")
    assert (tmp_path / "1.txt").read_text() == "a cat on grass"
    undo(tmp_path)
    assert (tmp_path / "1.txt").read_text() == "a dog on grass"


def test_a_plan_refuses_when_a_caption_changed_meanwhile(tmp_path):
    images = _dataset(tmp_path)
    changes = plan_edit(tmp_path, images, Operation("prepend", "ohwx"))
    (tmp_path / "1.txt").write_text("edited in another tab")
    with pytest.raises(EditError, match="changed since it was loaded"):
        apply_plan(tmp_path, changes, "prepend")
    assert (tmp_path / "0.txt").read_text() == "a dog" and not (tmp_path / "2.txt").exists()


def test_two_tabs_saving_the_same_caption(tmp_path):
    _dataset(tmp_path)
    save_caption(tmp_path, "0.png", "tab one", loaded="a dog")
    with pytest.raises(EditError, match="0.txt: changed since it was loaded"):
        save_caption(tmp_path, "0.png", "tab two", loaded="a dog")
    assert (tmp_path / "0.txt").read_text() == "tab one"


def test_bad_input_is_refused_with_one_line(tmp_path):
    images = _dataset(tmp_path)
    (tmp_path / "1.txt").write_bytes("un caf\xe9".encode("cp1252"))
    with pytest.raises(EditError, match=r"1\.txt: not UTF-8"):
        plan_edit(tmp_path, images, Operation("prepend", "ohwx"))
    with pytest.raises(EditError, match="not a valid regular expression"):
        plan_edit(tmp_path, images, Operation("replace", "(", "x", regex=True))
    assert (tmp_path / "0.txt").read_text() == "a dog"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trainer_backend", "dataset", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_cli_edit_and_undo(tmp_path):
    _dataset(tmp_path)
    out = _cli("edit", str(tmp_path), "--prepend", "ohwx")
    assert out.returncode == 0, out.stderr
    assert "3 caption files would change" in out.stdout
    assert (tmp_path / "1.txt").read_text() == "ohwx, a dog on grass" and (tmp_path / "2.txt").read_text() == "ohwx"
    out = _cli("undo", str(tmp_path))
    assert out.returncode == 0 and "prepend 'ohwx'" in out.stdout
    assert (tmp_path / "1.txt").read_text() == "a dog on grass" and not (tmp_path / "2.txt").exists()
    out = _cli("undo", str(tmp_path))
    assert out.returncode == 2 and out.stderr.strip() == f"error: {tmp_path}: nothing to undo"


def test_a_metadata_json_dataset_keeps_its_captions_there(tmp_path):
    import json
    from trainer_backend.workbench.checks import CheckSettings, annotate
    for name in ("a.png", "b.png"):
        (tmp_path / name).write_bytes(b"")
    meta = [{"path": "a.png", "tags": ["dog", "grass"], "score": 7}, {"path": "b.png", "tags": ["cat"]}]
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    items, _ = annotate(tmp_path, [{"path": "a.png", "flags": {}}, {"path": "b.png", "flags": {}}], CheckSettings())
    assert [i["caption"] for i in items] == ["dog, grass", "cat"] and not items[0]["flags"]
    save_caption(tmp_path, "a.png", "ohwx, dog, grass", loaded="dog, grass")
    saved = json.loads((tmp_path / "meta.json").read_text())
    assert saved[0] == {"path": "a.png", "tags": ["ohwx", "dog", "grass"], "score": 7} and saved[1] == meta[1]
    assert not (tmp_path / "a.txt").exists()
    with pytest.raises(EditError, match="metadata caption changed since it was loaded"):
        save_caption(tmp_path, "a.png", "tab two", loaded="dog, grass")
    undo(tmp_path)
    assert json.loads((tmp_path / "meta.json").read_text()) == meta


def test_bulk_edits_on_a_metadata_json_dataset_rewrite_its_records_and_undo_restores_the_file(tmp_path):
    """Trigger word and tag rename over a metadata-JSON dataset: each JSON file rewritten once, other keys and
    records kept; Undo gives back the file byte for byte (its own formatting included)."""
    import json
    for name in ("a.png", "b.png", "c.png"):
        (tmp_path / name).write_bytes(b"")
    original = json.dumps([{"path": "a.png", "tags": ["dog", "grass"], "score": 7},
                           {"path": "b.png", "tags": "cat, grass"}, {"note": "not a record"}], indent=4)
    (tmp_path / "meta.json").write_text(original)
    (tmp_path / "c.txt").write_text("grass")   # an image with its own caption file keeps it
    changes = plan_edit(tmp_path, ["a.png", "b.png", "c.png"], Operation("rename_tag", "grass", "lawn"))
    text = preview(changes)
    assert text.splitlines()[0] == "3 captions would change (2 in metadata JSON)"
    assert "a.png: dog, grass -> dog, lawn" in text and "c.txt: grass -> lawn" in text
    apply_plan(tmp_path, changes, "rename grass")
    saved = json.loads((tmp_path / "meta.json").read_text())
    assert saved == [{"path": "a.png", "tags": ["dog", "lawn"], "score": 7}, {"path": "b.png", "tags": ["cat", "lawn"]},
                     {"note": "not a record"}]
    assert (tmp_path / "c.txt").read_text() == "lawn"
    prepend = plan_edit(tmp_path, ["a.png", "b.png"], Operation("prepend", "ohwx"))
    apply_plan(tmp_path, prepend, "prepend ohwx")
    assert [r.get("tags") for r in json.loads((tmp_path / "meta.json").read_text())[:2]] == \
        [["ohwx", "dog", "lawn"], ["ohwx", "cat", "lawn"]]
    assert plan_edit(tmp_path, ["a.png", "b.png"], Operation("prepend", "ohwx")) == []   # no duplicate trigger
    undo(tmp_path)
    undo(tmp_path)
    assert (tmp_path / "meta.json").read_text() == original and (tmp_path / "c.txt").read_text() == "grass"


def test_a_metadata_bulk_edit_is_refused_when_the_file_changed_after_the_preview(tmp_path):
    import json
    (tmp_path / "a.png").write_bytes(b"")
    (tmp_path / "meta.json").write_text(json.dumps([{"path": "a.png", "tags": ["dog"]}]))
    changes = plan_edit(tmp_path, ["a.png"], Operation("append", "ohwx"))
    (tmp_path / "meta.json").write_text(json.dumps([{"path": "a.png", "tags": ["another program"]}]))
    with pytest.raises(EditError, match="meta.json"):
        apply_plan(tmp_path, changes, "append")
    assert json.loads((tmp_path / "meta.json").read_text()) == [{"path": "a.png", "tags": ["another program"]}]
