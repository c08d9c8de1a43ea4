"""The Run page: controls and live view of the current run, refreshed by a timer from the
run directory (so a browser refresh or a GUI restart loses nothing)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from gui import run_monitor as rm
from gui import run_tools
from gui.shared_state import Studio
from gui.run_control import StartRefused, exited_at, run_started_at
from gui.run_state import run_status, snapshot
from gui.run_strengths import build_strengths_panel
from gui.sample_grid import GRID_JS, grid_html, grid_of
from gui.secrets_panel import env_from_rows
from gui.system_monitor import system_markdown

CONFIRM_WINDOW_S = 10.0


@dataclass
class RunView:
    """Display components for one run (used by the Run page and the Runs page viewer)."""
    progress: gr.HTML
    loss: gr.LinePlot
    lr: gr.LinePlot
    caption: gr.Markdown
    log: gr.Textbox
    gallery: gr.HTML      # the sample grid
    artifacts: gr.Markdown
    compare: gr.Dropdown  # another run whose grid is shown beside (not refreshed by the timer)
    compare_grid: gr.HTML

    def components(self) -> list:
        return [self.progress, self.loss, self.lr, self.caption, self.log, self.gallery, self.artifacts]


def build_run_view(prefix: str) -> RunView:
    progress = gr.HTML("", elem_id=f"{prefix}-progress")
    with gr.Row():
        loss = gr.LinePlot(x="step", y="value", color="series", title="Loss", height=260, elem_id=f"{prefix}-loss",
                           x_title="step", y_title="loss", scale=3,
                           color_map={"loss": "#a9b4d6", "loss (smoothed)": "#3949ab",
                                      "validation loss": "#e67e22"})
        lr = gr.LinePlot(x="step", y="lr", title="Learning rate", height=260, elem_id=f"{prefix}-lr", scale=2,
                         y_axis_format=".1e")
    caption = gr.Markdown("", elem_id=f"{prefix}-chart-caption")
    log = gr.Textbox(label="Log (the last lines)", lines=16, max_lines=16, autoscroll=True,
                     interactive=False, elem_id=f"{prefix}-log", elem_classes=["run-log"], buttons=["copy"])
    # the sample grid (rows = prompts, columns = steps; gui/sample_grid.py), another run's beside it
    compare = gr.Dropdown(choices=[], value=None, label="Compare the samples with another run", allow_custom_value=False,
                          elem_id=f"{prefix}-compare")
    with gr.Row(equal_height=False):
        gallery = gr.HTML("", elem_id=f"{prefix}-samples", js_on_load=GRID_JS, padding=False)
        compare_grid = gr.HTML("", elem_id=f"{prefix}-compare-grid", js_on_load=GRID_JS, padding=False, visible=False)
    artifacts = gr.Markdown("", elem_id=f"{prefix}-artifacts")
    # the log box follows its newest line (gradio's autoscroll does not, for values replaced by a timer)
    log.change(None, js=f"() => {{ setTimeout(() => {{ const t = document.querySelector('#{prefix}-log textarea');"
                        " if (t) t.scrollTop = t.scrollHeight; }, 50); }", show_progress="hidden")
    return RunView(progress, loss, lr, caption, log, gallery, artifacts, compare, compare_grid)


def _displayable(path: str, roots: list[Path]):
    """A file path gradio may serve (a video sample plays in the gallery), or a PIL copy for folders
    outside the allowed roots (a video: its frame strip)."""
    resolved = Path(path).resolve()
    if any(resolved.is_relative_to(r) for r in roots):
        return path
    from trainer_backend.data.video import VIDEO_EXTENSIONS, clip_strip
    if resolved.suffix.lower() in VIDEO_EXTENSIONS:
        return clip_strip(resolved)
    from PIL import Image
    with Image.open(resolved) as im:
        return im.convert("RGB")


def _gallery_update(images: list[tuple[str, str]], roots: list[Path]) -> dict:
    out = []
    for path, caption in images:
        try:
            out.append((_displayable(path, roots), caption))
        except (OSError, ValueError):  # BadClip is a ValueError
            continue  # a sample being written right now; next refresh
    return gr.update(value=out, visible=bool(out))


def wire_compare(view: RunView, studio: Studio) -> None:
    """The compare chooser lists the runs when opened; choosing one shows its grid beside this run's."""
    def choices():
        return gr.update(choices=[("(none)", "")] + [(d.name, str(d)) for d in studio.manager.run_dirs()])

    def other(selected):
        if not selected or not Path(selected).is_dir():
            return gr.update(value="", visible=False)
        snap = snapshot(Path(selected))
        return gr.update(value=grid_html(grid_of(Path(selected), snap.samples), title=Path(selected).name),
                         visible=True)
    view.compare.focus(choices, outputs=view.compare, show_progress="hidden")
    view.compare.change(other, inputs=view.compare, outputs=view.compare_grid, show_progress="hidden")


def changed(seen: dict, now: dict, key: str, value):
    """`value` when it differs from what this page last got for `key` (remembered in `now`), else
    gr.skip(): a timer tick re-sends nothing the browser already shows."""
    now[key] = value
    return value if seen.get(key) != value or seen.get("run") != now.get("run") else gr.skip()


def _as_update(value, make):
    """make(value), or the skip `changed` returned."""
    return value if value == gr.skip() else make(value)


def view_updates(studio: Studio, run_dir: Path | None, seen: dict, price: float = 0.0) -> tuple[list, dict]:
    """Updates for a RunView's components: only those whose content changed since `seen` (what
    the previous tick sent, returned as the second item for the next one) are sent."""
    if run_dir is None or not Path(run_dir).is_dir():
        if seen.get("run") == "":
            return [gr.skip()] * 7, seen
        return ["<div class='run-progress'>No run yet: load a preset and press Start on the Training page.</div>",
                None, None, "", "", "", ""], {"run": ""}
    snap = snapshot(run_dir)
    status = run_status(run_dir, snap)
    numbers = rm.progress_numbers(snap, status.alive, run_started_at(run_dir), exited=exited_at(run_dir))
    gpus = max(1, int(snap.plan.get("num_processes", 1) or 1))
    html = rm.progress_html(status, numbers, rm.cost_line(numbers["elapsed"], numbers["eta"], price or 0.0, gpus),
                            rm.warnings_html(snap))
    log = rm.log_path(run_dir)
    now = {"run": str(run_dir), "steps": len(snap.steps), "samples": len(snap.samples),
           "log": (log.stat().st_size if log else 0), "status": status.status, "artifacts": (len(snap.checkpoints), len(snap.uploads),
                                                                       len(snap.outputs), bool(snap.terminal),
                                                                       len(snap.warnings), bool(snap.adapter_effect))}
    same_run = seen.get("run") == now["run"]
    charts_changed = not same_run or seen.get("steps") != now["steps"]
    caption = (f"{len(snap.steps)} loss points · last loss {numbers['loss']:.4f}" if numbers["loss"] is not None
               else "no loss points yet")
    updates = [changed(seen, now, "html", html),
               rm.loss_frame(snap) if charts_changed else gr.skip(),
               rm.lr_frame(snap) if charts_changed else gr.skip(),
               changed(seen, now, "caption", caption),
               (rm.log_tail(run_dir, with_console=status.status in ("error", "interrupted"))
                if (not same_run or seen.get("log") != now["log"] or seen.get("status") != now["status"])
                else gr.skip()),
               (grid_html(grid_of(run_dir, snap.samples), title=Path(run_dir).name)
                if (not same_run or seen.get("samples") != now["samples"]) else gr.skip()),
               rm.artifacts_markdown(run_dir, snap) if (not same_run or seen.get("artifacts") != now["artifacts"])
               else gr.skip()]
    return updates, now


def message_meta(run_dir: Path | None, ttl: float, holds: tuple[str, ...] | None = None) -> dict:
    """What an action message belongs to: its run, when it was said, how long it may stay and,
    where given, the run statuses it holds for ("stopping, saving state…" goes once the run is no
    longer running or stopping, even if the run ended before the page looked again)."""
    return {"run": str(run_dir or ""), "status": None, "at": time.time(), "ttl": ttl,
            "holds": list(holds) if holds is not None else None}


def message_update(meta: dict | None, run_dir: Path | None, status: str, now: float | None = None):
    """(message update, meta) for one tick: a message goes when another run is shown, when the
    run's status changes after the action took effect, or when it is older than its ttl."""
    if not meta:
        return gr.skip(), None
    now = now or time.time()
    if meta["run"] != str(run_dir or "") or now - meta["at"] > meta["ttl"]:
        return "", None
    if meta.get("holds") is not None:
        return (gr.skip(), meta) if status in meta["holds"] else ("", None)
    if meta["status"] is None:
        return gr.skip(), {**meta, "status": status}
    if meta["status"] != status:
        return "", None
    return gr.skip(), meta


def build_run_page(studio: Studio, secret_boxes: list, tab: gr.Tab) -> gr.Timer:
    """The Run page; returns its refresh timer (it runs while the tab is shown: gui/studio.py)."""
    header = gr.Markdown("", elem_id="run-header")
    with gr.Row(equal_height=True):
        stop = gr.Button("■ Stop (save state)", variant="stop", elem_id="run-stop")
        save_now = gr.Button("Save checkpoint now", elem_id="run-save-now")
        sample_now = gr.Button("Sample now", elem_id="run-sample-now")
        resume = gr.Button("⟳ Resume", elem_id="run-resume")
        kill = gr.Button("Force kill", variant="stop", visible=False, elem_id="run-kill")
        download = gr.DownloadButton("Download full log", value=None, elem_id="run-download-log")
    message = gr.Markdown("", elem_id="run-message")
    view = build_run_view("run")
    shown = gr.State("")        # the run this page shows: its buttons act on it, never on a newer one
    build_strengths_panel(studio, shown)   # "sample this LoRA / checkpoint at strengths" (gui/run_strengths.py)
    wire_compare(view, studio)
    with gr.Row(equal_height=False):
        with gr.Column(scale=1):
            tb_button = gr.Button("Open TensorBoard", elem_id="run-tensorboard", size="md")
            tb_link = gr.Markdown("", elem_id="run-tensorboard-link")
        outputs_files = gr.File(label="Output files", file_count="multiple", interactive=False,
                                elem_id="run-output-files", visible=False, scale=2)
        with gr.Column(scale=1):
            zip_button = gr.Button("Download run folder (.zip)", elem_id="run-zip-button", size="md")
            zip_file = gr.File(label="Run folder", interactive=False, elem_id="run-zip", visible=False)
    with gr.Accordion("System", open=True):
        system = gr.Markdown(system_markdown(studio.manager.runs_dir), elem_id="system-monitor")
        price = gr.Number(label="Cost estimate: $ per GPU-hour (optional)", value=0, minimum=0,
                          elem_id="run-price")
    seen = gr.State({})
    armed = gr.State(None)
    said = gr.State(None)       # message_meta of the message under the buttons
    timer = gr.Timer(studio.settings.refresh_s, active=False)

    def tick(price_value, seen_value, said_value):
        studio.manager.reap()
        pending = studio.manager.pending
        waiting = studio.manager.queue_note() if pending is None else None   # a job not started yet
        if pending is not None or waiting is not None:
            name = (pending or waiting)[0]
            text = (f"starting {name}: checking the config and launching… ({int(time.time() - pending[1])} s)"
                    if pending else f"{name}: {waiting[1]} (the Queue page orders the jobs)")
            html = ("<div class='run-progress status-starting'><div class='run-status' id='run-status-text'>"
                    f"{text}</div></div>")
            off = gr.update(interactive=False)
            return [f"### Run: {name}", gr.update(visible=False), None, off, off, off, off, html,
                    *[gr.skip()] * (len(view.components()) - 1), system_markdown(studio.manager.runs_dir), {},
                    "", "", None, gr.update(value=None, visible=False), gr.Timer(value=studio.settings.refresh_s)]
        run_dir = studio.manager.current_run()
        seen_value = seen_value or {}
        updates, now = view_updates(studio, run_dir, seen_value, float(price_value or 0))
        now = dict(now)
        if run_dir is None:
            head, can_kill, log, state = "### No run yet", False, None, None
        else:
            head = f"### Run: {run_dir.name}"
            state = run_status(run_dir)
            can_kill = state.alive and studio.manager.may_kill(run_dir)
            log = rm.log_path(run_dir)
        if run_dir is not None and seen_value.get("artifacts") != now.get("artifacts") or \
                seen_value.get("run") != now.get("run"):
            files = run_tools.output_files(run_dir, snapshot(run_dir).outputs) if run_dir else []
            files_update = gr.update(value=files or None, visible=bool(files))
        else:
            files_update = gr.skip()
        alive = bool(state and state.alive)
        # a live run is followed every refresh_s; an ended one or none only every idle_refresh_s (a new
        # Start selects this tab, which sends everything; a run started elsewhere shows within that time)
        interval = changed(seen_value, now, "interval",
                           studio.settings.refresh_s if alive else studio.settings.idle_refresh_s)
        msg, said_next = message_update(said_value, run_dir, state.status if state else "")
        # only what changed since the last tick goes to the browser (a tick without news sends ~nothing)
        live = _as_update(changed(seen_value, now, "alive", alive), lambda v: gr.update(interactive=v))
        return [changed(seen_value, now, "head", head),
                _as_update(changed(seen_value, now, "can_kill", can_kill), lambda v: gr.update(visible=v)),
                changed(seen_value, now, "log_file", str(log) if log else None), live, live, live,
                _as_update(changed(seen_value, now, "resumable", bool(state and state.resumable)),
                           lambda v: gr.update(interactive=v)),
                *updates, changed(seen_value, now, "system", system_markdown(studio.manager.runs_dir)), now,
                str(run_dir or ""), msg, said_next if said_next != said_value else gr.skip(), files_update,
                _as_update(interval, lambda v: gr.Timer(value=v))]

    outputs = [header, kill, download, stop, save_now, sample_now, resume, *view.components(), system, seen, shown,
               message, said, outputs_files, timer]
    # a tick and a tab selection never overlap (one group, one at a time): `seen` is read when an
    # event runs, so an older event finishing last could leave a button disabled that the page
    # believes it already enabled (Start and the buttons keep their own group, so a tick never waits
    # for a launch)
    timer.tick(tick, inputs=[price, seen, said], outputs=outputs, show_progress="hidden", concurrency_limit=1,
               concurrency_id="run-view")
    # components of a hidden tab are drawn when it is shown: send everything again then
    tab.select(lambda price_value, said_value: tick(price_value, {}, said_value), inputs=[price, said],
               outputs=outputs, show_progress="hidden", concurrency_limit=1, concurrency_id="run-view")

    def control(action, ttl: float = 30.0, holds: tuple[str, ...] | None = None):
        def handler(shown_run, *args):
            run_dir = Path(shown_run) if shown_run else None
            if run_dir is None:
                return "No run to control.", None
            try:
                return action(run_dir, *args), message_meta(run_dir, ttl, holds)
            except StartRefused as e:
                return f"⚠️ {e}", message_meta(run_dir, ttl)
        return handler

    stop.click(control(lambda d: studio.manager.stop(d), ttl=3600, holds=("starting", "running", "stopping")),
               inputs=shown, outputs=[message, said],
               concurrency_id="run-control")
    save_now.click(control(lambda d: studio.manager.save_now(d)), inputs=shown, outputs=[message, said],
                   concurrency_id="run-control")
    sample_now.click(control(lambda d: studio.manager.sample_now(d)), inputs=shown, outputs=[message, said],
                     concurrency_id="run-control")

    def do_resume(run_dir, *secret_values):
        from trainer_backend.config import ConfigError
        try:
            started = studio.manager.resume(run_dir, env_from_rows(list(secret_values)))
        except ConfigError as e:
            return f"⚠️ Cannot resume: {e}"
        return f"Resuming **{started.name}** from its last checkpoint…"

    def resume_and_follow(*args):   # the page follows the resumed run at once, not at the idle pace
        return (*control(do_resume)(*args), gr.Timer(value=studio.settings.refresh_s))

    resume.click(resume_and_follow, inputs=[shown, *secret_boxes], outputs=[message, said, timer],
                 concurrency_id="run-control")

    def kill_handler(shown_run, armed_at):
        run_dir = Path(shown_run) if shown_run else None
        if run_dir is None:
            return "No run to control.", None, None
        try:
            if not armed_at or time.time() - armed_at > CONFIRM_WINDOW_S:
                return (f"Press **Force kill** again within {CONFIRM_WINDOW_S:.0f} s: the process is killed and "
                        "progress since the last checkpoint is lost."), time.time(), \
                    message_meta(run_dir, CONFIRM_WINDOW_S)
            return studio.manager.kill(run_dir), None, message_meta(run_dir, 30.0)
        except StartRefused as e:
            return f"⚠️ {e}", None, message_meta(run_dir, 30.0)

    kill.click(kill_handler, inputs=[shown, armed], outputs=[message, armed, said], concurrency_id="run-control")

    def open_tensorboard(shown_run):
        if not shown_run:
            return "No run to show."
        try:
            url = run_tools.tensorboard_url(Path(shown_run), python=studio.settings.python)
        except FileNotFoundError as e:
            return f"⚠️ No TensorBoard logs yet: {e}"
        return f"TensorBoard (this machine only): [{url}]({url}) — it may take a few seconds to answer."

    tb_button.click(open_tensorboard, inputs=shown, outputs=tb_link)

    def zip_run(shown_run):
        if not shown_run:
            return gr.update(value=None, visible=False)
        return gr.update(value=run_tools.run_zip(Path(shown_run)), visible=True)

    zip_button.click(zip_run, inputs=shown, outputs=zip_file)
    return timer
