"""The Queue page: running jobs (progress, GPUs, ETA), waiting jobs in their order, finished ones;
buttons to reorder, delete, stop, retry, pause the queue; the Run page follows the job picked here;
API tokens created here are shown once."""
from __future__ import annotations

import time
from pathlib import Path

import gradio as gr
import pandas as pd

from trainer_backend.config import ConfigError

from gui.shared_state import Studio

RUNNING_COLUMNS = ["job", "name", "status", "GPUs", "step", "loss", "it/s", "ETA"]
WAITING_COLUMNS = ["#", "job", "name", "priority", "GPUs", "submitted by"]
FINISHED_COLUMNS = ["job", "name", "status", "step", "ended", "message"]
FINISHED_SHOWN = 50
MOVES = (("⤒ Top", "top"), ("↑ Up", "up"), ("↓ Down", "down"), ("⤓ Bottom", "bottom"))


def _eta(seconds) -> str:
    if not isinstance(seconds, (int, float)):
        return ""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _gpus(job: dict) -> str:
    return ",".join(job["gpus"]) if job["gpus"] else ("cpu" if not job["gpus_wanted"] else f"{job['gpus_wanted']} GPU")


def queue_tables(studio: Studio) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, str]:
    """The three tables and the line above them, from one read of the queue."""
    queue = studio.queue
    jobs = queue.jobs()
    running = [[j["id"], j["name"], j["status"], _gpus(j), f"{j['step'] or 0}/{j['total'] or '?'}",
                f"{j['loss']:.4f}" if isinstance(j["loss"], (int, float)) else "",
                f"{j['it_per_s']:.2f}" if isinstance(j["it_per_s"], (int, float)) else "", _eta(j["eta_s"])]
               for j in jobs if j["status"] in ("starting", "running", "stopping")]
    waiting = [[n + 1, j["id"], j["name"], j["priority"], _gpus(j), j["submitted_by"]]
               for n, j in enumerate(j for j in jobs if j["status"] == "waiting")]
    finished = [[j["id"], j["name"], j["status"], j["step"] or 0,
                 time.strftime("%m-%d %H:%M", time.localtime(j["ended"])) if j["ended"] else "", j["message"]]
                for j in jobs if j["status"] in ("done", "error", "stopped", "interrupted")][:FINISHED_SHOWN]
    slots = ", ".join(queue.worker.gpu_slots) or "none"
    line = (f"**{len(running)} running, {len(waiting)} waiting** · GPUs: {slots} (plus one CPU slot) · "
            + ("⏸ **paused**: no new job starts" if queue.store.paused else "▶ running jobs as slots free up"))
    return (pd.DataFrame(running, columns=RUNNING_COLUMNS), pd.DataFrame(waiting, columns=WAITING_COLUMNS),
            pd.DataFrame(finished, columns=FINISHED_COLUMNS), line)


def _act(studio: Studio, job_id, what: str) -> str:
    """One button's action on the picked job; the message says what happened or why not."""
    if job_id is None or job_id == "":
        return "Pick a job first: click its row, or type its number."
    queue, job_id = studio.queue, int(job_id)
    try:
        job = queue.get(job_id)
        if what in ("top", "up", "down", "bottom"):
            queue.move(job_id, what)
            return f"Moved job {job_id} ({job.name}) {what}."
        if what == "delete":
            queue.delete(job_id)
            return f"Deleted waiting job {job_id} ({job.name})."
        if what == "stop":
            queue.stop(job_id)
            return f"Stopping job {job_id} ({job.name}): it saves state, then stops."
        if what == "retry":
            queue.retry(job_id)
            return f"Job {job_id} ({job.name}) is waiting again."
    except (LookupError, ConfigError) as e:
        return f"⚠️ {e}"
    return ""


def build_queue_page(studio: Studio, main_tabs: gr.Tabs) -> gr.Timer:
    """The Queue page; returns its refresh timer (it runs while the tab is shown: gui/studio.py)."""
    running, waiting, finished, line = queue_tables(studio)
    status = gr.Markdown(line, elem_id="queue-status")
    with gr.Row(equal_height=True):
        pause = gr.Button("⏸ Pause queue", elem_id="queue-pause", size="md", scale=0, min_width=140)
        resume = gr.Button("▶ Resume queue", elem_id="queue-resume", size="md", scale=0, min_width=140)
        refresh = gr.Button("Refresh", elem_id="queue-refresh", size="md", scale=0, min_width=100)
    gr.Markdown("#### Running")
    running_table = gr.Dataframe(value=running, headers=RUNNING_COLUMNS, interactive=False, elem_id="queue-running")
    gr.Markdown("#### Waiting, in the order they start")
    waiting_table = gr.Dataframe(value=waiting, headers=WAITING_COLUMNS, interactive=False, elem_id="queue-waiting",
                                 max_height=420)
    with gr.Row(equal_height=True):
        picked = gr.Number(label="Job (click a row)", precision=0, value=None, elem_id="queue-job", scale=0,
                           min_width=140)
        moves = [gr.Button(label, size="sm", elem_id=f"queue-{where}", scale=0, min_width=90) for label, where in MOVES]
        delete = gr.Button("Delete", size="sm", elem_id="queue-delete", variant="stop", scale=0, min_width=90)
        stop = gr.Button("Stop", size="sm", elem_id="queue-stop", scale=0, min_width=90)
        retry = gr.Button("Retry", size="sm", elem_id="queue-retry", scale=0, min_width=90)
        follow = gr.Button("Show on the Run page", size="sm", elem_id="queue-follow", scale=0, min_width=160)
    message = gr.Markdown("", elem_id="queue-message")
    gr.Markdown(f"#### Finished (the last {FINISHED_SHOWN})")
    finished_table = gr.Dataframe(value=finished, headers=FINISHED_COLUMNS, interactive=False,
                                  elem_id="queue-finished")
    with gr.Accordion("API tokens", open=False, elem_id="queue-tokens"):
        gr.Markdown("Scripts and the client reach the queue at `/api/v1` with a token (docs/queue.md). "
                    "A token is shown once; the studio keeps only its hash.")
        with gr.Row(equal_height=True):
            token_name = gr.Textbox(label="Name", elem_id="token-name", scale=2)
            token_scope = gr.Radio(["write", "read"], value="write", label="Scope", elem_id="token-scope", scale=1)
            make_token = gr.Button("Create token", elem_id="token-create", scale=0, min_width=140)
        token_out = gr.Markdown("", elem_id="token-out")
    timer = gr.Timer(2.0, active=False)
    tables = [running_table, waiting_table, finished_table, status]

    def tick():
        return list(queue_tables(studio))

    def act(what):
        def run(job_id):
            return [_act(studio, job_id, what), *queue_tables(studio)]
        return run

    def set_paused(paused: bool):
        def run():
            studio.queue.set_paused(paused)
            return list(queue_tables(studio))
        return run

    def pick(evt: gr.SelectData, table: pd.DataFrame):
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        try:
            return int(table.iloc[row]["job"])
        except (IndexError, KeyError, ValueError, TypeError):
            return gr.skip()

    def show_on_run_page(job_id):
        if job_id is None or job_id == "":
            return "Pick a job first: click its row, or type its number.", gr.skip()
        try:
            job = studio.queue.get(int(job_id))
        except LookupError as e:
            return f"⚠️ {e}", gr.skip()
        studio.manager.current = Path(job.run_dir)
        return "", gr.Tabs(selected="run")

    def create_token(name: str, scope: str):
        from trainer_backend.jobqueue.tokens import new_token
        try:
            token = new_token(studio.queue.store, (name or "").strip(), scope)
        except ConfigError as e:
            return f"⚠️ {e}"
        return (f"Token **{name}** ({scope}); copy it now, it is not shown again:\n\n```\n{token}\n```")

    timer.tick(tick, outputs=tables, show_progress="hidden")
    refresh.click(tick, outputs=tables, show_progress="hidden")
    pause.click(set_paused(True), outputs=tables, show_progress="hidden")
    resume.click(set_paused(False), outputs=tables, show_progress="hidden")
    for table in (running_table, waiting_table, finished_table):
        table.select(pick, inputs=[table], outputs=[picked], show_progress="hidden")
    for button, (_, where) in zip(moves, MOVES):
        button.click(act(where), inputs=[picked], outputs=[message, *tables], show_progress="hidden")
    for button, what in ((delete, "delete"), (stop, "stop"), (retry, "retry")):
        button.click(act(what), inputs=[picked], outputs=[message, *tables], show_progress="hidden")
    follow.click(show_on_run_page, inputs=[picked], outputs=[message, main_tabs], show_progress="hidden")
    make_token.click(create_token, inputs=[token_name, token_scope], outputs=[token_out], show_progress="hidden")
    return timer
