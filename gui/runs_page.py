"""The Runs page: every run in the runs folder with its status; open one to see its config,
log, chart and samples, load its config into the Training page, resume it, or delete it."""
from __future__ import annotations

import time
from pathlib import Path

import gradio as gr
import pandas as pd

from trainer_backend.config import ConfigError, load_config
from trainer_backend.run.contract import CONFIG_FILE

from gui.shared_state import Studio
from gui.run_control import StartRefused, first_started_at
from gui.run_page import build_run_view, view_updates, wire_compare
from gui.run_state import run_status, snapshot
from gui.schema_form import config_to_values
from gui.secrets_panel import env_from_rows
from gui.widgets import FormWidgets

CONFIRM_WINDOW_S = 10.0
COLUMNS = ["run", "status", "started", "steps", "final loss", "outputs"]


def runs_table(studio: Studio) -> pd.DataFrame:
    return runs_overview(studio)[0]


def runs_overview(studio: Studio) -> tuple[pd.DataFrame, bool]:
    """The runs table, and whether any run in it is live (one scan of the runs folder for both)."""
    rows, any_alive = [], False
    studio.manager.reap()   # exit codes of finished runs first: a failed run is not "interrupted"
    for run_dir in studio.manager.run_dirs():
        snap = snapshot(run_dir)
        status = run_status(run_dir, snap)
        any_alive = any_alive or status.alive
        started = first_started_at(run_dir, snap)   # a resumed run: when it first started
        last = snap.last_step
        loss = last.get("loss")
        rows.append([run_dir.name, clipped(status.text),
                     time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if started else "",
                     f"{last.get('step', 0)}/{last.get('total_steps', '?')}" if last else "0",
                     f"{loss:.4f}" if isinstance(loss, (int, float)) else "",
                     ", ".join(Path(o).name for o in snap.outputs)])
    return pd.DataFrame(rows, columns=COLUMNS), any_alive


STATUS_WIDTH = 60


def clipped(text: str, width: int = STATUS_WIDTH) -> str:
    """A status as the table shows it: one line, at most `width` characters (a long error would push
    every other column out of view); the whole text is in the run's view below the table."""
    line = " ".join(str(text).split())
    return line if len(line) <= width else line[:width - 1].rstrip() + "…"


def run_choices(studio: Studio) -> list[tuple[str, str]]:
    return [(d.name if d.parent == studio.manager.runs_dir else str(d), str(d)) for d in studio.manager.run_dirs()]


def build_runs_page(studio: Studio, form: FormWidgets, form_after_load, main_tabs: gr.Tabs,
                    secret_boxes: list, tab: gr.Tab) -> gr.Timer:
    """The Runs page; returns its refresh timer (it runs while the tab is shown: gui/studio.py)."""
    form_inputs = form.inputs
    with gr.Row(equal_height=True):
        refresh = gr.Button("Refresh", elem_id="runs-refresh", scale=0, min_width=120, size="md")
        gr.Markdown(f"Runs folder: `{studio.manager.runs_dir}`. A long status is cut short here: click the run "
                    f"to read it whole below.", elem_id="runs-folder")
    table = gr.Dataframe(value=runs_table(studio), headers=COLUMNS, interactive=False, elem_id="runs-table",
                         wrap=True, max_height=320)
    with gr.Row(equal_height=False, elem_classes=["preset-row"]):
        selector = gr.Dropdown(choices=run_choices(studio), value=None, label="Open a run", scale=3,
                               elem_id="runs-select")
        load_cfg = gr.Button("Load this config", elem_id="runs-load-config", scale=1, size="md")
        follow = gr.Button("Show on the Run page", elem_id="runs-follow", scale=1, size="md")
        resume = gr.Button("⟳ Resume", elem_id="runs-resume", scale=1, size="md")
        delete = gr.Button("Delete run", variant="stop", elem_id="runs-delete", scale=1, size="md")
    message = gr.Markdown("", elem_id="runs-message")
    view = build_run_view("runs")
    wire_compare(view, studio)
    with gr.Accordion(CONFIG_FILE, open=False):
        config_code = gr.Code(language=None, interactive=False, elem_id="runs-config")
    seen = gr.State({})
    armed = gr.State(None)
    timer = gr.Timer(studio.settings.refresh_s * 2, active=False)

    def show(selected, seen_value):
        table_value, any_alive = runs_overview(studio)
        # every 2 × refresh_s while a run is live, else every idle_refresh_s (a tick costs the browser
        # about half a CPU-second; see gui/run_page.py)
        pace = studio.settings.refresh_s * 2 if any_alive else studio.settings.idle_refresh_s
        return [*table_and_view(table_value, selected, seen_value), gr.Timer(value=pace)]

    def table_and_view(table_value, selected, seen_value):
        choices = run_choices(studio)
        if not selected and choices:
            selected = choices[0][1]          # open the newest run until the user picks another
        chooser = gr.update(choices=choices, value=selected)
        if not selected or not Path(selected).is_dir():
            return [table_value, chooser, *[gr.skip()] * len(view.components()), gr.skip(), seen_value]
        updates, now = view_updates(studio, Path(selected), seen_value or {})
        config = Path(selected) / CONFIG_FILE
        text = config.read_text(encoding="utf-8") if config.is_file() else "(no config.toml)"
        return [table_value, chooser, *updates, text if seen_value.get("run") != selected else gr.skip(), now]

    outputs = [table, selector, *view.components(), config_code, seen, timer]
    # the events that send the view take turns: each reads `seen` when it runs (see run_page)
    one_at_a_time = {"concurrency_limit": 1, "concurrency_id": "runs-view"}
    selector.change(show, inputs=[selector, seen], outputs=outputs, show_progress="hidden", **one_at_a_time)
    refresh.click(show, inputs=[selector, seen], outputs=outputs, **one_at_a_time)
    timer.tick(show, inputs=[selector, seen], outputs=outputs, show_progress="hidden", **one_at_a_time)
    # components of a hidden tab are drawn when it is shown: send everything again then
    tab.select(lambda selected: show(selected, {}), inputs=selector, outputs=outputs, show_progress="hidden",
               **one_at_a_time)

    def on_load_config(selected, *current):
        if not selected:
            return [gr.skip()] * len(form_inputs) + ["Choose a run first.", gr.skip()]
        try:
            cfg = load_config(Path(selected) / CONFIG_FILE)
        except ConfigError as e:
            return [gr.skip()] * len(form_inputs) + [f"⚠️ {e}", gr.skip()]
        values = config_to_values(studio.fields, cfg)
        for i, f in enumerate(studio.fields):
            if f.secret:
                values[i] = current[i]
        return [*values, f"Loaded the config of **{Path(selected).name}** into the Training page.",
                gr.Tabs(selected="training")]

    ev = load_cfg.click(form.loading(on_load_config, at=1), inputs=[selector, form.values],
                        outputs=[*form_inputs, message, main_tabs, form.patch], show_progress_on=message)
    form_after_load(ev)

    def on_follow(selected):
        if not selected:
            return "Choose a run first.", gr.skip()
        studio.manager.current = Path(selected)
        return "", gr.Tabs(selected="run")

    follow.click(on_follow, inputs=selector, outputs=[message, main_tabs])

    def on_resume(selected, *secret_values):
        if not selected:
            return "Choose a run first.", gr.skip()
        try:
            run_dir = studio.manager.resume(Path(selected), env_from_rows(list(secret_values)))
        except (StartRefused, ConfigError) as e:
            return f"⚠️ {e}", gr.skip()
        return f"Resuming **{run_dir.name}**…", gr.Tabs(selected="run")

    resume.click(on_resume, inputs=[selector, *secret_boxes], outputs=[message, main_tabs],
                 concurrency_id="run-control")

    def on_delete(selected, armed_value):
        if not selected:
            return "Choose a run first.", None, gr.skip()
        if not armed_value or armed_value[0] != selected or time.time() - armed_value[1] > CONFIRM_WINDOW_S:
            return (f"Press **Delete run** again within {CONFIRM_WINDOW_S:.0f} s to delete "
                    f"`{selected}` and everything in it (checkpoints, outputs, samples)."), (selected, time.time()), \
                gr.skip()
        try:
            done = studio.manager.delete(Path(selected))
        except StartRefused as e:
            return f"⚠️ {e}", None, gr.skip()
        return done, None, gr.update(choices=run_choices(studio), value=None)

    expire = gr.Timer(CONFIRM_WINDOW_S, active=False)

    def delete_and_expire(selected, armed_value):
        text, armed_next, chooser = on_delete(selected, armed_value)
        return text, armed_next, chooser, gr.Timer(active=armed_next is not None)

    delete.click(delete_and_expire, inputs=[selector, armed], outputs=[message, armed, selector, expire],
                 concurrency_id="run-control")
    expire.tick(lambda: ["", None, gr.Timer(active=False)], outputs=[message, armed, expire], show_progress="hidden")

    def on_table_select(evt: gr.SelectData):
        """A click on a row of the table opens that run below."""
        name = (getattr(evt, "row_value", None) or [None])[0]
        match = [d for d in studio.manager.run_dirs() if d.name == name]
        return gr.update(value=str(match[0])) if match else gr.skip()

    table.select(on_table_select, outputs=selector, show_progress="hidden")
    return timer
