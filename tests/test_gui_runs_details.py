"""Issue 29 items 5-6: the Runs table keeps a long error to one short cell; a resumed run shows its first
start and its total elapsed time; elapsed never goes back when the process exits; a CPU user is not told
to choose other GPUs; the form hides the file fields of families the model given is not; labels read as
words."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, settings, strategies as st

from gui import processes as procs
from gui.run_control import RunManager, first_started_at
from gui.run_monitor import progress_numbers
from gui.run_state import fold_events
from gui.runs_page import STATUS_WIDTH, clipped, runs_overview
from gui.schema_form import config_to_values, field_visibility, form_fields, human_label
from trainer_backend.config import from_dict, load_config, save_toml, to_dict
from trainer_backend.run.run_folder import claim

ROOT = Path(__file__).resolve().parents[1]


def events_file(run_dir: Path, events: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    claim(run_dir)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=0, max_size=400))
def test_a_status_cell_is_one_short_line(text):
    cell = clipped(text)
    assert len(cell) <= STATUS_WIDTH and "\n" not in cell
    if len(" ".join(text.split())) <= STATUS_WIDTH:
        assert cell == " ".join(text.split())


def test_a_long_error_is_cut_short_in_the_runs_table_and_whole_in_the_run(tmp_path):
    from gui.run_state import run_status
    message = "RuntimeError: " + "a very long reason " * 30
    run = tmp_path / "runs" / "failed"
    events_file(run, [{"event": "plan", "time": 1.0, "total_steps": 10}, {"event": "error", "time": 2.0,
                                                                           "message": message}])

    class Studio:
        manager = RunManager(tmp_path / "runs")
    table, _ = runs_overview(Studio())
    cell = table.loc[table["run"] == "failed", "status"].item()
    assert len(cell) <= STATUS_WIDTH and cell.endswith("…")
    assert message.strip() in run_status(run).text   # the run's own view keeps the whole text


SESSION_1 = [{"event": "plan", "time": 100.0, "total_steps": 20}, {"event": "step", "time": 110.0, "step": 5},
             {"event": "stopped", "time": 130.0, "step": 5}]
SESSION_2 = [{"event": "plan", "time": 1000.0, "total_steps": 20}, {"event": "step", "time": 1010.0, "step": 6}]


def test_a_resumed_run_shows_its_first_start_and_its_total_elapsed(tmp_path):
    snap = fold_events(SESSION_1 + SESSION_2)
    assert snap.earlier_s == 30.0 and snap.session_start == 1000.0
    # the resume's process started at 995 (loading before its plan event)
    numbers = progress_numbers(snap, alive=True, started=995.0, now=1020.0)
    assert numbers["elapsed"] == 30.0 + 25.0
    run = tmp_path / "r"
    events_file(run, SESSION_1 + SESSION_2)
    procs.write_process_record(run, 1, ["x"])   # pid 1's start time: "now", as a resume's record would be
    assert first_started_at(run) == 100.0


def test_elapsed_never_goes_back_when_the_process_exits():
    events = SESSION_1[:2] + [{"event": "done", "time": 145.0, "step": 20}]
    snap = fold_events(events)
    while_exiting = progress_numbers(snap, alive=True, started=98.0, now=147.0)["elapsed"]
    after = progress_numbers(snap, alive=False, started=98.0, now=200.0, exited=147.5)["elapsed"]
    assert after >= while_exiting


def test_a_cpu_run_is_not_told_to_choose_other_gpus(tmp_path):
    live = tmp_path / "runs" / "busy"
    live.mkdir(parents=True)
    cfg = from_dict({"output": {"dir": str(tmp_path / "runs"), "name": "busy"}, "hardware": {"cpu": True}})
    save_toml(to_dict(cfg), live / "config.toml")
    claim(live)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        procs.write_process_record(live, sleeper.pid, ["python", "-m", "trainer_backend", "train"])
        manager = RunManager(tmp_path / "runs", gpu_count=0)
        other = from_dict({"output": {"dir": str(tmp_path / "runs"), "name": "second"}, "hardware": {"cpu": True}})
        text = manager._conflict(other, other.run_dir)
        assert "already using the CPU" in text and "gpu_ids" not in text, text
        # on a machine with several GPUs, a GPU run is pointed at the others
        save_toml(to_dict(from_dict({"output": {"dir": str(tmp_path / "runs"), "name": "busy"}})), live / "config.toml")
        gpu_run = from_dict({"output": {"dir": str(tmp_path / "runs"), "name": "g"}})
        assert "gpu_ids" in RunManager(tmp_path / "runs", gpu_count=4)._conflict(gpu_run, gpu_run.run_dir)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_form_hides_the_file_fields_of_other_families():
    fields = form_fields()

    def shown(cfg) -> set[str]:
        return {f.dotted for f, v in zip(fields, field_visibility(fields, config_to_values(fields, cfg))) if v}
    sd1 = load_config(ROOT / "presets" / "demo-sd1-lora.toml")           # a folder: SD1 by its pipeline
    flux = load_config(ROOT / "presets" / "demo-flux-lora.toml")         # builtin:tiny-flux
    assert sd1.model.arch == flux.model.arch == "auto"
    assert not {"model.clip_l", "model.clip_g", "model.t5", "model.text_encoder"} & shown(sd1)
    assert {"model.clip_l", "model.t5"} <= shown(flux) and "model.clip_g" not in shown(flux)
    unknown = flux.model_copy(deep=True)
    unknown.model.path = "/nowhere/model.safetensors"                       # nothing to read: every field
    assert {"model.clip_l", "model.clip_g", "model.t5", "model.text_encoder"} <= shown(unknown)


def test_labels_read_as_words():
    by_key = {f.dotted: human_label(f) for f in form_fields()}
    assert by_key["model.clip_l"] == "CLIP L · clip_l"
    assert by_key["model.t5"].startswith("T5 ·")
