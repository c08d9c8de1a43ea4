"""The run-directory contract (trainer_backend/run/contract.py) is the one list of event kinds and
file names: the trainer emits only declared kinds, and the studio's fold handles every one."""
import ast
import dataclasses
from pathlib import Path

import pytest

from gui.run_state import FOLDS, Snapshot, fold_events
from trainer_backend.run.contract import EVENT_KINDS, FIELDS, OPEN, TERMINAL, Event

ROOT = Path(__file__).resolve().parent.parent


def emitted_kinds() -> dict[str, str]:
    """kind -> where, for every event kind the trainer's sources emit: string literals and
    Event.X given to emit()/_emit(), and Event.X chosen before an emit (the stop kinds)."""
    found = {}
    for path in (ROOT / "trainer_backend").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            value = None
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "emit", "_emit") and node.args:
                value = node.args[0]
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Event":
                value = node
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                found[value.value] = f"{path.relative_to(ROOT)}:{node.lineno}"
            elif isinstance(value, ast.Attribute) and getattr(value.value, "id", "") == "Event":
                if value.attr.isupper():
                    found[Event[value.attr].value] = f"{path.relative_to(ROOT)}:{node.lineno}"
    return found


def test_the_trainer_emits_only_declared_kinds():
    kinds = emitted_kinds()
    undeclared = {k: where for k, where in kinds.items() if k not in EVENT_KINDS}
    assert not undeclared, f"emitted but not in run/contract.py: {undeclared}"
    assert {"plan", "step", "done", "stopped", "preempted", "checkpoint", "upload"} <= set(kinds)


def emitted_fields() -> list[tuple[str, str, str]]:
    """(kind, keyword, where) for every keyword given to an emit whose kind is written in the call."""
    found = []
    for path in (ROOT / "trainer_backend").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "emit", "_emit", "_record_event") and node.args):
                continue
            first = node.args[1] if getattr(node.func, "id", "") == "_record_event" else node.args[0]
            kind = (first.attr if isinstance(first, ast.Attribute) and getattr(first.value, "id", "") == "Event"
                    else None)
            for keyword in node.keywords:
                if kind and keyword.arg:
                    found.append((Event[kind].value, keyword.arg, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return found


def test_the_trainer_writes_only_declared_fields():
    found = emitted_fields()
    assert len({kind for kind, _, _ in found}) >= 10  # the scan sees the emits
    undeclared = [(k, f, where) for k, f, where in found if FIELDS[Event(k)] is not OPEN and f not in FIELDS[Event(k)]]
    assert not undeclared, f"fields missing from run/contract.py FIELDS: {undeclared}"
    assert set(FIELDS) == set(Event), "every event kind declares its fields"


def test_the_trainer_names_kinds_through_the_contract():
    """No `emit("step", …)`: the trainer writes Event.X (so a renamed kind cannot be missed)."""
    literal = []
    for path in (ROOT / "trainer_backend").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                    "emit", "_emit") and node.args and isinstance(node.args[0], ast.Constant):
                literal.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not literal, f"event kinds written as string literals: {literal}"


def test_the_studio_folds_every_kind_the_trainer_can_write():
    assert set(FOLDS) == set(Event), f"gui/run_state.py FOLDS misses {set(Event) - set(FOLDS)}"


def test_emitting_an_undeclared_kind_is_an_error(tmp_path):
    from trainer_backend.run.events import RunEvents
    events = RunEvents(tmp_path, enabled=True, tensorboard=False)
    try:
        events.emit(Event.EPOCH, epoch=1, step=2)
        with pytest.raises(ValueError):
            events.emit("finished", step=3)
    finally:
        events.close()
    assert '"event": "epoch"' in (tmp_path / "events.jsonl").read_text()


@pytest.mark.parametrize("kind", sorted(EVENT_KINDS))
def test_the_studio_handles_every_kind(kind):
    """Folding one event of each kind changes what the Run page knows (times aside)."""
    event = {"event": kind, "time": 1.0, "step": 3, "epoch": 1, "outputs": ["x.safetensors"], "message": "m"}
    empty = dataclasses.asdict(Snapshot())
    folded = dataclasses.asdict(fold_events([event]))
    changed = {k for k in folded if k not in ("first_time", "last_time") and folded[k] != empty[k]}
    assert changed, f"the studio ignores {kind!r} events"
    if kind in TERMINAL:
        assert fold_events([event]).terminal == event
