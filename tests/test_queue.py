"""The job queue in-process: real SQLite files, real processes (tiny python commands where a
trainer is not what is tested; the API tests run real trainers)."""
import json
import sqlite3
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from trainer_backend.config import ConfigError
from trainer_backend.jobqueue import JobQueue, QueueFileError, QueueSettings, QueueStore
from trainer_backend.jobqueue import slots as slot_rules
from trainer_backend.jobqueue.store import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION

# writes when it started and ended and the GPUs it was given into its own folder
RECORDER = ("import json, os, time; t0 = time.time(); time.sleep({sleep}); "
            "open('seen.json', 'w').write(json.dumps({{'start': t0, 'end': time.time(), "
            "'cuda': os.environ.get('CUDA_VISIBLE_DEVICES')}}))")


def recorder(sleep: float = 0.5) -> list[str]:
    return [sys.executable, "-c", RECORDER.format(sleep=sleep)]


def seen(job) -> dict:
    return json.loads((Path(job.run_dir) / "seen.json").read_text())


@pytest.fixture
def make_queue(tmp_path):
    made = []

    def make(gpus=(), **kw):
        queue = JobQueue(QueueSettings(runs_dir=tmp_path / "runs", gpu_slots=list(gpus), poll_s=0.1, **kw)).start()
        made.append(queue)
        return queue
    yield make
    for queue in made:
        queue.close()


def test_two_jobs_on_one_slot_run_one_after_the_other(make_queue):
    queue = make_queue()     # no GPU: one CPU slot
    first, second = queue.submit_command("first", recorder()), queue.submit_command("second", recorder())
    assert [queue.worker.wait(j.id, 60).status for j in (first, second)] == ["done", "done"]
    assert seen(second)["start"] >= seen(first)["end"]
    assert queue.store.get(first.id).gpus == ["cpu"] and seen(first)["cuda"] is None


def test_two_single_gpu_jobs_on_two_slots_run_at_once_each_with_its_own_gpu(make_queue):
    queue = make_queue(gpus=["0", "1"])
    a, b = queue.submit_command("a", recorder(2.0)), queue.submit_command("b", recorder(2.0))
    assert [queue.worker.wait(j.id, 60).status for j in (a, b)] == ["done", "done"]
    ra, rb = seen(a), seen(b)
    assert ra["start"] < rb["end"] and rb["start"] < ra["end"]          # they overlapped
    assert {ra["cuda"], rb["cuda"]} == {"0", "1"}
    assert queue.store.get(a.id).gpus == [ra["cuda"]]


def test_a_job_asking_for_more_gpus_than_there_are_fails_with_a_message_and_the_rest_run(make_queue):
    queue = make_queue(gpus=["0"])
    big = queue.submit_command("big", recorder(), gpus=2)
    small = queue.submit_command("small", recorder())
    assert queue.worker.wait(small.id, 60).status == "done"
    failed = queue.store.get(big.id)
    assert failed.status == "error" and "hardware.num_processes" in failed.message and "2 GPUs" in failed.message


def test_a_failing_job_shows_its_last_line_and_can_be_retried(make_queue, tmp_path):
    queue = make_queue()
    job = queue.submit_command("bad", [sys.executable, "-c", "import sys; print('the disk is full'); sys.exit(3)"])
    done = queue.worker.wait(job.id, 60)
    assert (done.status, done.exit_code, done.message) == ("error", 3, "the disk is full")
    assert queue.retry(job.id).status == "waiting"
    assert queue.worker.wait(job.id, 60).status == "error"


def test_stop_and_pause(make_queue):
    queue = make_queue()
    long = queue.submit_command("long", [sys.executable, "-c", "import time; time.sleep(60)"])
    import time
    end = time.monotonic() + 30
    while queue.store.get(long.id).status != "running" and time.monotonic() < end:
        time.sleep(0.1)
    queue.set_paused(True)
    after = queue.submit_command("after", recorder())
    assert queue.stop(long.id).status == "stopping"
    assert queue.worker.wait(long.id, 30).status == "stopped"
    time.sleep(0.5)
    assert queue.store.get(after.id).status == "waiting"            # paused: nothing new starts
    queue.set_paused(False)
    assert queue.worker.wait(after.id, 60).status == "done"


def test_order_priorities_front_move_and_delete(tmp_path):
    store = QueueStore(tmp_path / "q.sqlite3")

    def add(name, **kw):
        return store.add("command", name, str(tmp_path / name), argv=["true"], **kw).id
    a, b = add("a"), add("b")
    urgent = add("urgent", priority=5)
    c = add("c")
    front = add("front", front=True)
    names = lambda: [j.name for j in store.waiting()]  # noqa: E731
    assert names() == ["front", "urgent", "a", "b", "c"]
    store.move(c, "up")
    assert names() == ["front", "urgent", "a", "c", "b"]
    store.move(b, "top")
    assert names() == ["b", "front", "urgent", "a", "c"]
    store.cancel(a)
    assert names() == ["b", "front", "urgent", "c"]
    with pytest.raises(ConfigError, match="already writes to"):
        add("c")                                                     # one job per run folder
    assert {front, urgent} <= {j.id for j in store.waiting()}


def test_an_older_queue_file_is_migrated_and_keeps_its_jobs(tmp_path):
    path = tmp_path / "q.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(MIGRATIONS[0])                         # the first released layout
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO jobs (kind, name, run_dir, status, position, created) "
               "VALUES ('command', 'old', '/tmp/old', 'waiting', 1, 0)")
    db.commit()
    db.close()
    store = QueueStore(path)
    assert [j.name for j in store.waiting()] == ["old"] and store.waiting()[0].submitted_by == ""
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.parametrize("content", [b"this is not a database" * 100, "sqlite-other", "newer"])
def test_a_corrupt_foreign_or_newer_queue_file_is_refused_with_one_line_and_kept(tmp_path, content):
    path = tmp_path / "q.sqlite3"
    if content == "sqlite-other":
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE notes (text)")
        db.commit()
        db.close()
    elif content == "newer":
        QueueStore(path).close()
        db = sqlite3.connect(path)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        db.commit()
        db.close()
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    with pytest.raises(QueueFileError) as err:
        QueueStore(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "kept" in message
    assert path.read_bytes() == before


@settings(max_examples=200, deadline=None)
@given(gpus=st.integers(0, 8), busy_n=st.integers(0, 8),
       waiting=st.lists(st.integers(0, 9), max_size=12))
def test_slots_never_double_book_and_keep_queue_order(gpus, busy_n, waiting):
    slots = [str(i) for i in range(gpus)]
    busy = slots[:busy_n]
    jobs = [(i, n) for i, n in enumerate(waiting)]
    starts = slot_rules.assign(slots, busy, jobs)
    given_out = [s for _, got in starts for s in got]
    assert len(given_out) == len(set(given_out)) and not set(given_out) & set(busy)
    for job_id, got in starts:
        n = waiting[job_id]
        assert got == ([slot_rules.CPU] if n == 0 else got) and (n == 0 or len(got) == n)
    started = [i for i, _ in starts]
    # strictly in order: every job before the last started one started too, unless it can never fit
    if started:
        assert all(i in started or (waiting[i] > gpus) or (waiting[i] == 0 and slot_rules.CPU in busy)
                   or waiting[i] == 0 for i in range(max(started)))
