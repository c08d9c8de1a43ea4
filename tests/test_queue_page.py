"""The studio with its queue: Start puts the run at the front, Add to queue at the end, the Run page
says where a waiting run stands, and the Queue page's tables and buttons act on the real queue."""
import sys
from pathlib import Path

import pytest

from gui.queue_page import _act, queue_tables
from gui.shared_state import Settings, Studio
from trainer_backend.config import ConfigError, from_dict
from trainer_backend.jobqueue import JobQueue, QueueSettings

ROOT = Path(__file__).resolve().parent.parent


def config(runs: Path, name: str):
    return from_dict({"model": {"path": "builtin:tiny-sd1"},
                      "dataset": {"path": str(ROOT / "assets" / "demo_dataset"), "resolution": 32},
                      "schedule": {"max_steps": 2}, "output": {"dir": str(runs), "name": name}})


@pytest.fixture
def studio(tmp_path):
    runs = tmp_path / "runs"
    queue = JobQueue(QueueSettings(runs_dir=runs, poll_s=0.1)).start()
    queue.set_paused(True)          # the order is under test here; the API tests run the trainers
    yield Studio.create(Settings(runs_dir=runs), queue=queue)
    queue.close()


def test_start_goes_to_the_front_and_add_to_queue_to_the_end(studio):
    runs = studio.settings.runs_dir
    studio.manager.start(config(runs, "first"), front=False)
    studio.manager.start(config(runs, "second"), front=False)
    run_dir = studio.manager.start(config(runs, "now"))                      # Start
    assert [j.name for j in studio.queue.store.waiting()] == ["now", "first", "second"]
    assert studio.manager.current == run_dir
    assert studio.manager.queue_note() == ("now", "waiting in the queue: 1st of 3 (the queue is paused)")
    with pytest.raises(ConfigError, match="^output.name: job .* already writes to"):
        studio.manager.start(config(runs, "first"))
    running, waiting, finished, line = queue_tables(studio)
    assert list(waiting["name"]) == ["now", "first", "second"] and running.empty and finished.empty
    assert "3 waiting" in line and "paused" in line


def test_queue_page_buttons_reorder_delete_and_explain_refusals(studio):
    runs = studio.settings.runs_dir
    for name in ("a", "b", "c"):
        studio.manager.start(config(runs, name), front=False)
    ids = {j.name: j.id for j in studio.queue.store.waiting()}
    assert _act(studio, ids["c"], "top") == f"Moved job {ids['c']} (c) top."
    assert _act(studio, ids["a"], "down").startswith("Moved")
    assert list(queue_tables(studio)[1]["name"]) == ["c", "b", "a"]
    assert _act(studio, ids["b"], "delete").startswith("Deleted")
    assert "only a running job can be stopped" in _act(studio, ids["a"], "stop")
    assert _act(studio, 999, "retry") == "⚠️ no job 999"
    assert _act(studio, None, "up").startswith("Pick a job")
    assert list(queue_tables(studio)[1]["name"]) == ["c", "a"]


def test_a_finished_command_job_shows_in_the_finished_table(studio):
    studio.queue.set_paused(False)
    job = studio.queue.submit_command("cmd", [sys.executable, "-c", "print('hello')"])
    assert studio.queue.worker.wait(job.id, 60).status == "done"
    finished = queue_tables(studio)[2]
    assert list(finished["name"]) == ["cmd"] and list(finished["status"]) == ["done"]


def test_the_studio_builds_with_its_queue_page(studio):
    from gui.studio import build_app
    app = build_app(studio)
    ids = {getattr(block, "elem_id", None) for block in app.blocks.values()}
    assert {"page-queue", "queue-waiting", "add-to-queue", "token-create"} <= ids
