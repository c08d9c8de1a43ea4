"""'Sample this LoRA / checkpoint at strengths' (issue 33 item 2): a queue job draws a finished run's adapter at
several strengths with the run's prompts and seeds and writes `sample` events with strength and source into the
run, which the sample grid shows as new columns; strength 0 is the base model."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import make_dataset
from method_runs import last_checkpoint, train_run
from trainer_backend.__main__ import main as cli


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, tiny_models):
    tmp = tmp_path_factory.mktemp("strengths")
    data = make_dataset(tmp / "data", n=2, size=32)
    run, _, _ = train_run(tmp, tiny_models("sd1"), data, "tiny", "schedule.max_steps=2", "optimizer.lr=5e-2",
                          "checkpoints.every_n_steps=2", "samples.every_n_steps=2", 'samples.prompts="a red square --w 32 --h 32 --s 2\\n'
                          'a blue square --w 32 --h 32 --s 2"')
    return run


def _events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def test_a_strength_job_through_the_api_adds_columns_to_the_runs_grid(finished_run, tmp_path):
    """POST /api/v1/runs/<name>/sample-strengths queues the job; the queue runs it; the grid has the columns."""
    from fastapi.testclient import TestClient
    from gui.sample_grid import grid_of
    from trainer_backend.jobqueue import JobQueue, QueueSettings
    from trainer_backend.jobqueue.api import build_api
    from trainer_backend.jobqueue.tokens import new_token
    from trainer_backend.lora_tools.jobs import job_result
    run = finished_run
    before = [e for e in _events(run) if e["event"] == "sample"]
    queue = JobQueue(QueueSettings(runs_dir=run.parent, state_dir=tmp_path / "state", poll_s=0.1)).start()
    try:
        client = TestClient(build_api(queue))
        auth = {"Authorization": f"Bearer {new_token(queue.store, 'tester')}"}
        refused = client.post(f"/runs/{run.name}/sample-strengths", json={"source": "/etc/passwd"}, headers=auth)
        assert refused.status_code == 403 and "outside the run" in refused.json()["detail"]
        bad = client.post(f"/runs/{run.name}/sample-strengths", json={"strengths": "1,one"}, headers=auth)
        assert bad.status_code == 422 and bad.json()["detail"][0]["key"] == "--strengths"
        assert client.post("/runs/nope/sample-strengths", json={}, headers=auth).status_code == 404
        answer = client.post(f"/runs/{run.name}/sample-strengths", json={"strengths": "0,1"}, headers=auth)
        assert answer.status_code == 201, answer.text
        job = queue.get(answer.json()["id"])
        finished = queue.worker.wait(job.id, 300)
        assert finished.status == "done", (Path(job.run_dir) / "console.log").read_text()[-2000:]
        assert client.get(f"/jobs/{job.id}", headers=auth).json()["step"] == 4
    finally:
        queue.close()
    result = job_result(Path(job.run_dir))   # the job's own progress: one step per image
    assert result["state"] == "done" and result["step"] == result["total"] == 4 and len(result["outputs"]) == 4
    new = [e for e in _events(run) if e["event"] == "sample"][len(before):]
    assert [(e["strength"], e["source"]) for e in new] == [(0.0, "tiny.safetensors"), (1.0, "tiny.safetensors")]
    assert all(e["step"] == 2 and e["rows"] == [0, 1] and e["adapter"] == "LoRA" for e in new)
    grid = grid_of(run, before + new)
    assert grid.columns[-2:] == ["tiny.safetensors ×0", "tiny.safetensors ×1"]
    assert grid.prompts == ["a red square", "a blue square"]
    cells = [grid.cells[(r, c)] for c in (len(grid.columns) - 2, len(grid.columns) - 1) for r in (0, 1)]
    assert all(Path(p).is_file() for p in cells)
    base, full = (np.asarray(Image.open(grid.cells[(0, c)]), dtype=float) for c in (len(grid.columns) - 2,
                                                                                     len(grid.columns) - 1))
    assert np.abs(base - full).mean() > 0.5, "strength 0 and 1 drew the same image"


def test_a_checkpoint_at_strength_one_draws_the_runs_own_sample(finished_run, capsys):
    """The checkpoint of step 2 at strength 1 is the model the trainer sampled at step 2: the same image."""
    run = finished_run
    (trained,) = [e for e in _events(run) if e["event"] == "sample" and e.get("strength") is None and e["step"] == 2]
    assert cli(["lora", "sample", "--run", str(run), "--checkpoint", str(last_checkpoint(run)),
                "--strengths", "1"]) == 0
    (ours,) = [e for e in _events(run) if e["event"] == "sample" and e.get("source") == "step-00000002"]
    for mine, theirs in zip(ours["paths"], trained["paths"]):
        a = np.asarray(Image.open(run / mine), dtype=float)
        b = np.asarray(Image.open(theirs if Path(theirs).is_absolute() else run / theirs), dtype=float)
        assert np.abs(a - b).max() <= 2


def test_a_run_being_trained_is_refused_in_one_line(finished_run, tmp_path, capsys):
    from trainer_backend.run.run_lock import acquire
    with acquire(finished_run, by="train"):
        assert cli(["lora", "sample", "--run", str(finished_run), "--strengths", "1"]) == 2
    (err,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "already being trained" in err
    assert cli(["lora", "sample", "--run", str(finished_run), "--strengths", "1,x"]) == 2
    (err,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert err.startswith("error: --strengths:")


def test_the_run_pages_panel_lists_the_sources_and_queues_the_job(finished_run, tmp_path):
    from gui.run_strengths import sources, submit
    from gui.shared_state import Settings, Studio
    from trainer_backend.jobqueue import JobQueue, QueueSettings
    run = finished_run
    assert [label for label, _ in sources(run)] == ["output: tiny.safetensors", "checkpoint: step-00000002"]
    queue = JobQueue(QueueSettings(runs_dir=run.parent, state_dir=tmp_path / "state", poll_s=0.1))  # not started
    studio = Studio.create(Settings(runs_dir=run.parent), queue=queue)
    assert submit(studio, str(run), "", "1,x").startswith("⚠️ --strengths:")
    text = submit(studio, str(run), sources(run)[1][1], "0.5,1")
    assert text.startswith("Queued job 1: step-00000002 at 0.5,1 (waiting in the queue: 1st of 1)")
    (job,) = queue.store.waiting()
    assert job.argv[job.argv.index("--checkpoint") + 1] == str(run / "checkpoints" / "step-00000002")
    assert Path(job.run_dir).parent == run / "jobs"
