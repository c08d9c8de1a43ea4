"""Issue 16 item 7: the page keeps up with the trainer and a preset load does not freeze it.
A live-view tick without news re-sends nothing, a long run's chart is thinned, a preset load
sends only the values that change, and a repeated form refresh re-renders no error line or cell.
(bench/gui_responsiveness.py measures the same in chromium.)"""
from __future__ import annotations

import json
from collections import Counter
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest

from gui import processes as procs
from gui import run_monitor as rm
from gui.run_state import fold_events
from gui.shared_state import Settings, Studio


def _step(i, total=5000):
    return {"event": "step", "time": time.time(), "step": i, "total_steps": total, "epoch": 1, "loss": 1.0 / i,
            "lr": 1e-4, "it_per_s": 2.0, "eta_s": 5.0}


@pytest.fixture()
def studio(tmp_path):
    return Studio.create(Settings(runs_dir=tmp_path / "runs", presets_dir=tmp_path / "presets"))


@pytest.fixture()
def live_run(studio):
    run = studio.settings.runs_dir / "live"
    run.mkdir(parents=True)
    (run / "events.jsonl").write_text("".join(json.dumps(_step(i)) + "\n" for i in range(1, 50)))
    (run / "train.log").write_text("step 1\n")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    procs.write_process_record(run, sleeper.pid, ["accelerate", "launch"])
    yield run
    sleeper.kill()
    sleeper.wait()


def _sent(updates):
    return [i for i, u in enumerate(updates) if not (isinstance(u, dict) and u == gr.skip())]


def test_a_tick_without_news_sends_nothing_and_a_new_step_only_what_it_changes(studio, live_run, monkeypatch):
    from gui.run_page import view_updates
    monkeypatch.setattr(rm, "time", SimpleNamespace(time=lambda: 2e9))   # the elapsed time stands still
    first, seen = view_updates(studio, live_run, {})
    assert len(_sent(first)) == 7   # a newly shown run: everything
    again, seen = view_updates(studio, live_run, seen)
    assert _sent(again) == [], "a tick with no new event re-sent components the page already shows"
    with open(live_run / "events.jsonl", "a") as fh:
        fh.write(json.dumps(_step(50)) + "\n")
    after, _ = view_updates(studio, live_run, seen)
    # progress line, loss chart, LR chart, chart caption; not the log, samples or artifacts
    assert _sent(after) == [0, 1, 2, 3]


def test_a_long_runs_charts_are_thinned_keeping_the_newest_point():
    snap = fold_events([_step(i) for i in range(1, 5001)])
    loss, lr = rm.loss_frame(snap), rm.lr_frame(snap)
    assert len(loss) <= 2 * (rm.CHART_POINTS + 1) and len(lr) <= rm.CHART_POINTS + 1
    assert loss["step"].max() == 5000 and lr["step"].max() == 5000 and loss["step"].min() == 1
    smoothed = loss[loss["series"] == "loss (smoothed)"]
    # smoothed over every point, not over the thinned ones
    assert smoothed["value"].iloc[-1] == pytest.approx(rm.smooth([1.0 / i for i in range(1, 5001)])[-1])


def _fn(app, name):
    return [f.fn for f in app.fns.values() if f.name == name]


def test_a_preset_load_sends_only_the_values_that_change(studio):
    from gui.schema_form import config_to_values
    from gui.studio import build_app
    app = build_app(studio)
    label, current = studio.initial_values()
    on_load = _fn(app, "on_load")[0]
    target = "sdxl-lora-24gb (built-in)"
    out = on_load(target, current)
    values = out[:len(current)]
    wanted = config_to_values(studio.fields, studio.load_preset(target))
    differ = [i for i, (a, b) in enumerate(zip(current, wanted)) if a != b]
    assert 0 < len(differ) < len(current) // 4
    assert _sent(values) == differ, "unchanged fields were re-sent (each redraws its widget, fires change)"
    assert all(values[i] == wanted[i] for i in differ)
    # loading the preset the form already shows changes no widget
    assert _sent(on_load(label, current)[:len(current)]) == []
    assert out[-1] == [[i, wanted[i]] for i in differ], "the form's values in the browser must follow the Load"



def test_a_repeated_form_refresh_re_renders_no_error_line_or_cell(studio):
    from gui.studio import build_app
    app = build_app(studio)
    label, values = studio.initial_values()
    refresh = _fn(app, "refresh_with_visibility")[0]
    n = len(studio.fields)
    refresh_fn = next(f for f in app.fns.values() if f.name == "refresh_with_visibility")
    secrets = [""] * (len(refresh_fn.inputs) - 5)   # the secrets panel's name/value boxes
    # inputs: the form's values, the secrets, the inspected signature, what was sent, the values Start
    # last refused, the preset label (the draft's); outputs end with what was sent, then the browser's
    # draft of the form and its line
    first = refresh(values, *secrets, "", None, None, label)
    assert len(_sent(first[:n])) == n          # the first refresh sets every error line
    draft, differs = first[-2:]
    model_path = values[[f.dotted for f in studio.fields].index("model.path")]
    assert draft["preset"] == label and draft["values"]["model.path"] == model_path and differs == ""
    second = refresh(values, *secrets, first[n + 10], first[-3], None, label)   # inspected signature, what was sent
    form_part = second[:n] + second[n + 11:-3]   # error lines, then cells and section headings
    assert _sent(form_part) == [], f"{len(_sent(form_part))} unchanged error lines/cells re-sent"


def test_an_edit_is_one_event(studio):
    """Each event the page sends walks Gradio's component tree once per input and per trigger (the
    refresh has ~280): the browser's draft of the form is saved by the refresh itself, so an edit
    is one event, not two (a second one cost ~40 % of an edit's CPU in chromium, docs/gui.md)."""
    config = _page_config(studio)
    form_ids = {c["id"] for c in config["components"]
                if str(c.get("props", {}).get("elem_id", "")).startswith("field-")}
    listeners = Counter((target, event) for dep in config["dependencies"] if dep.get("backend_fn")
                        for target, event in dep["targets"] if target in form_ids)
    assert len({t for t, _ in listeners}) == len(studio.fields)
    assert set(listeners.values()) == {1}, [k for k, v in listeners.items() if v > 1][:5]
    refresh = next(d for d in config["dependencies"] if d.get("api_name") == "refresh_with_visibility")
    storage = [c["id"] for c in config["components"] if c["type"] == "browserstate"]
    assert storage and storage[0] in refresh["outputs"]     # the draft is kept by the edit's own event


def _page_config(studio) -> dict:
    from gui.studio import build_app
    return build_app(studio).get_config_file()


def test_values_set_by_a_function_fire_no_per_field_refresh(studio):
    """A preset load sets many fields at once: their edit events must be user-only (`input`, a
    textbox's blur/submit), not `change`, which fires for every field a function sets and queued
    one full form refresh per changed field (14 events per Load instead of 3)."""
    config = _page_config(studio)
    form_ids = {f"field-{f.section}-{f.key}" for f in studio.fields}
    ids = {c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") in form_ids}
    assert len(ids) == len(form_ids)
    listened = [(target, event) for dep in config["dependencies"] for target, event in dep["targets"]
                if target in ids]
    assert listened, "the form's fields trigger nothing"
    assert not [e for _, e in listened if e == "change"], sorted({e for _, e in listened})


def test_no_event_tracks_progress_on_the_whole_form(studio):
    """The browser updates the loading status of every progress target of every event that ran,
    at each status change, searching all components each time: an event whose outputs are the form
    must show its progress on one component, or a preset load blocks the page for seconds."""
    config = _page_config(studio)
    for dep in config["dependencies"]:
        targets = dep.get("show_progress_on") or dep["outputs"]
        # a Run page's status, charts and log (11) are fine; the form's fields (hundreds) are not
        assert len(targets) <= 20 < len(studio.fields), (dep.get("api_name"), len(dep["outputs"]))



def test_no_event_of_the_server_reads_the_whole_form(studio):
    """Gradio's page keeps a loading-status entry for every input of every event that has completed
    and updates all of them, each with a walk of the component tree, at every status change of any
    event: the form's refresh read its ~225 widgets at every page load, and every tick of the Run
    page paid for them (0.76 of every second of the browser's main thread, docs/gui.md). Events read
    the form's values from one hidden component, which each field's edit updates in the browser
    first (no round trip, no loading status), before the refresh on the same trigger reads it."""
    config = _page_config(studio)
    by_elem = {c.get("props", {}).get("elem_id"): c["id"] for c in config["components"]}
    values_id = by_elem["form-values"]
    field_ids = [by_elem[f.elem_id] for f in studio.fields]
    server = [d for d in config["dependencies"] if d.get("backend_fn")]
    widest = max(server, key=lambda d: len(d["inputs"]))
    assert len(widest["inputs"]) <= 20 < len(field_ids), (widest.get("api_name"), len(widest["inputs"]))
    assert sum(values_id in d["inputs"] for d in server) >= 8   # refresh, Start, Load, Save, Save as, ...
    for i, field_id in enumerate(field_ids):
        listeners = [d for d in config["dependencies"] if any(t == field_id for t, _ in d["targets"])]
        browser_only, *rest = listeners
        assert not browser_only.get("backend_fn") and browser_only["inputs"] == [field_id, values_id]
        assert browser_only["outputs"] == [values_id] and f"v[{i}] = value" in browser_only["js"]
        assert [d["api_name"] for d in rest] == ["refresh_with_visibility"]
        assert {e for _, e in browser_only["targets"]} == {e for t, e in rest[0]["targets"] if t == field_id}
    # an event that sets fields (Load, Reset, kohya import, a run's config, the draft restore) sends a
    # patch of what it set, merged into the values in the browser, then the refresh reads them
    patch_id = by_elem["form-patch"]
    deps = config["dependencies"]
    setters = [d for d in deps if patch_id in d["outputs"]]
    assert len(setters) == 6   # ... and the Datasets page's "Train on this dataset"
    for setter in setters:
        assert setter["outputs"][:len(field_ids)] == field_ids and values_id in setter["inputs"]
        (merge,) = [d for d in deps if d.get("trigger_after") == setter["id"]]
        assert not merge.get("backend_fn") and merge["inputs"] == [patch_id, values_id]
        (refresh,) = [d for d in deps if d.get("trigger_after") == merge["id"]]
        assert refresh["backend_fn"] and refresh["inputs"][0] == values_id


def test_only_the_shown_page_ticks_and_an_idle_run_page_ticks_slowly(studio, live_run):
    """A tick of the Run page cost the browser ~0.7 CPU-s with this form (every status change of any
    event updates the loading status of every input an event has read): the Run and Runs pages tick
    only while their tab is shown, and the Run page follows a live run every refresh_s but an ended
    one, or none, every idle_refresh_s."""
    from gui.studio import build_app
    app = build_app(studio)
    # the LoRA tools page's timer runs only while one of its jobs does (started by its Run button)
    (lora_timer,) = [b for b in app.blocks.values() if isinstance(b, gr.Timer) and any(
        f.targets == [(b._id, "tick")] and f.fn.__module__ == "gui.lora_tools_page" for f in app.fns.values())]
    assert not lora_timer.active
    timers = sorted((b for b in app.blocks.values() if isinstance(b, gr.Timer) and b.value < 5 and b is not lora_timer),
                    key=lambda t: t.value)
    run_timer, runs_timer, datasets_timer = timers   # refresh_s, 2 × refresh_s, the Datasets page's 4 s
    assert not run_timer.active and not runs_timer.active and not datasets_timer.active  # the page opens on Training
    tab_ids = {b._id: b.id for b in app.blocks.values() if isinstance(b, gr.Tab)}
    switched = {tab_ids[f.targets[0][0]]: [u.constructor_args["active"] for u in f.fn()]
                for f in app.fns.values() if f.outputs == [run_timer, runs_timer, datasets_timer]
                and f.targets[0][1] == "select"}
    assert switched == {"training": [False, False, False], "run": [True, False, False],
                        "runs": [False, True, False], "datasets": [False, False, True],
                        "lora-tools": [False, False, False]}

    (runs_tick,) = [f for f in app.fns.values() if f.targets == [(runs_timer._id, "tick")]]
    assert runs_tick.fn(None, {})[-1].constructor_args == {"value": studio.settings.idle_refresh_s}  # none listed
    (tick,) = [f for f in app.fns.values() if f.targets == [(run_timer._id, "tick")]]
    assert tick.outputs[-1] is run_timer
    assert tick.fn(0, {}, None)[-1].constructor_args == {"value": studio.settings.idle_refresh_s}  # no run
    (live_run / "config.toml").write_text("")     # now a run folder the Runs page lists, and it is live
    assert runs_tick.fn(None, {})[-1].constructor_args == {"value": studio.settings.refresh_s * 2}
    studio.manager.current = live_run                                       # the run the page shows
    assert tick.fn(0, {}, None)[-1].constructor_args == {"value": studio.settings.refresh_s}   # the live run
    os.kill(json.loads((live_run / "process.json").read_text())["pid"], signal.SIGKILL)
    deadline = time.time() + 30
    while procs.is_alive(procs.read_process_record(live_run)) and time.time() < deadline:
        time.sleep(0.1)
    assert tick.fn(0, {}, None)[-1].constructor_args == {"value": studio.settings.idle_refresh_s}  # ended
    assert runs_tick.fn(None, {})[-1].constructor_args == {"value": studio.settings.idle_refresh_s}


def test_a_datasets_tick_resends_the_grid_only_when_it_changed(tmp_path):
    """While thumbnails were being made, each 4 s tick re-sent the whole grid (1 MB at 10,000 images) though
    only the index file's time had changed: now the grid, buckets and tags go only when what they show differs."""
    from gui.studio import build_app
    from tests.workbench_images import write_dataset
    studio = Studio.create(Settings(runs_dir=tmp_path / "runs", presets_dir=tmp_path / "presets",
                                    datasets_dir=tmp_path / "datasets"))
    folder = tmp_path / "datasets" / "dogs"
    write_dataset(folder, 3, size=(32, 32))
    app = build_app(studio)
    (tick,) = [f for f in app.fns.values() if f.name == "on_tick"]
    state = {"indices": [], "page": 0, "selected": None, "loaded": None}
    args = lambda state: ["dogs", {}, state, "", "", "", ""]  # noqa: E731
    first = tick.fn(*args(state))   # nothing drawn yet: everything is sent
    assert isinstance(first[0], str) and "img_00002.png" in first[0]
    state = first[3]
    os.utime(folder, ns=(time.time_ns(), time.time_ns() + 10**9))   # a new stamp, the same files
    again = tick.fn(*args(state))
    assert [isinstance(v, str) for v in again[:2]] == [False, True], "the grid was re-sent unchanged"
    state = again[3]
    write_dataset(folder, 1, size=(32, 32), start=3)   # a new image: the grid is sent, with it
    os.utime(folder, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    added = tick.fn(*args(state))
    assert isinstance(added[0], str) and "img_00003.png" in added[0]
