"""The Training page: schema tabs, dataset inspector, live plan, command preview, Start."""
from __future__ import annotations

import time

from dataclasses import dataclass
from typing import Callable

import gradio as gr

from trainer_backend.config import ConfigError
from trainer_backend.run.contract import CONFIG_FILE

from gui import dataset_view as dv
from gui.shared_state import Studio
from gui.run_control import StartRefused
from gui.schema_form import error_field, field_visibility, form_problems
from gui.secrets_panel import build_secrets_panel, env_from_rows, status_markdown
from gui.system_monitor import gpus_markdown
from gui.widgets import (FormWidgets, edit_triggers, error_updates, only_changed, render_form, shown_errors,
                         tab_id, unplaced_errors)

# A field's edit and the refresh a load chains (page load, preset, a run's config) take turns in the
# order they were sent: run side by side, the load's refresh, started with the old values, could
# finish last and leave the plan of values the form no longer shows (seen once in the browser test).
FORM_REFRESH = "form-refresh"


@dataclass
class EditHook:
    """Work that rides on the form's refresh: one round trip per edit, not two. Each event Gradio's
    page sends walks its whole component tree once per input and per trigger, and an event on
    every field has ~280 triggers: a second event per edit (the browser's draft of the form) cost
    the page ~40 % of an edit's CPU (docs/gui.md)."""
    inputs: list                    # after the form's own inputs
    outputs: list                   # after the refresh's own outputs
    fn: Callable                    # (form_values: list, *extra_values) -> one value per output


@dataclass
class TrainingPage:
    form: FormWidgets
    message: gr.Markdown            # page-level messages (Start, presets)
    refresh_outputs: list           # what `refresh` updates (after the error lines)
    refresh: callable               # (values of refresh_inputs) -> updates of [*form.errors, *refresh_outputs]
    inspected: gr.State
    start_button: gr.Button
    secret_boxes: list              # (name, value) textboxes, flat
    shown: gr.State                 # keys of the error-line and cell updates the browser has (only_changed)
    edit_hook: EditHook             # rides on every refresh (its inputs after `refused`, its outputs last)
    refused: gr.State               # the form's values Start last refused (its message stays while they hold)

    @property
    def refresh_inputs(self) -> list:
        return [self.form.values, *self.secret_boxes, self.inspected, self.shown, self.refused,
                *self.edit_hook.inputs]


def _inspector(ui: dict) -> None:
    with gr.Accordion("Dataset inspector", open=True, elem_id="dataset-inspector"):
        ui["inspect_md"] = gr.Markdown("Set dataset.path to see the images, captions and buckets.",
                                       elem_id="inspect-summary")
        with gr.Row():
            ui["buckets"] = gr.BarPlot(x="bucket", y="images", title="Bucket histogram", height=220, y_lim=[0, None],
                                       elem_id="bucket-plot", scale=2)
            ui["tags"] = gr.Dataframe(headers=["tag", "count"], label="Top tags", interactive=False,
                                      max_height=240, elem_id="top-tags", scale=2)
        ui["thumbs"] = gr.Gallery(label="Images", columns=8, height=220, allow_preview=True, elem_id="thumbs")


def _gpus(ui: dict) -> None:
    gr.Markdown("#### Detected GPUs")
    ui["gpus_md"] = gr.Markdown(gpus_markdown(), elem_id="gpus-detected")
    gr.Markdown("#### Step plan: what Start will run, next to the same config on 1 GPU")
    ui["plan_md"] = gr.Markdown("The plan appears when the dataset has been inspected.", elem_id="plan-table")


def _preview(ui: dict) -> None:
    gr.Markdown("The exact command the Start button runs, and the config file it writes "
                "(secrets never appear here: they go to the process environment only).")
    # sized to their content (no inner scrollbar for a few lines; long ones scroll past 40 lines)
    ui["cmd_shell"] = gr.Code(label="Command", language="shell", interactive=False, elem_id="cmd-shell",
                              wrap_lines=True, lines=1, max_lines=12)
    with gr.Accordion(f"argv and {CONFIG_FILE}", open=False):
        ui["cmd_argv"] = gr.Code(label="argv (JSON list)", language="json", interactive=False, elem_id="cmd-argv",
                                 lines=1, max_lines=40)
        ui["cmd_toml"] = gr.Code(label=CONFIG_FILE, language=None, interactive=False, elem_id="cmd-toml",
                                 lines=1, max_lines=40)


def build_training_page(studio: Studio, initial_values: list, main_tabs: gr.Tabs,
                        on_edit: EditHook | None = None) -> TrainingPage:
    ui: dict = {}
    form = render_form(studio.fields, initial_values,
                       extras={"Dataset": lambda: _inspector(ui), "GPUs": lambda: _gpus(ui)})
    secret_boxes, secret_status = build_secrets_panel()
    with gr.Row(equal_height=True, elem_id="start-row"):   # sticky: always in view (docs/gui.md)
        start = gr.Button("▶ Start training", variant="primary", elem_id="start-training", scale=1)
        enqueue = gr.Button("Add to queue", elem_id="add-to-queue", scale=0, min_width=140)
        message = gr.Markdown("", elem_id="training-message")
    with gr.Accordion("Command preview", open=True, elem_id="command-preview"):   # a panel, not a hidden tab
        _preview(ui)
    inspected = gr.State("")
    shown = gr.State(None)
    refused = gr.State(None)
    fields = studio.fields

    def refresh(*args):
        """Validate, inspect the dataset (cached), recompute the plan and the command preview."""
        n = len(fields)
        values, typed, seen = list(args[:n]), env_from_rows(list(args[n:-1])), args[-1]
        cfg, errors = form_problems(fields, values)
        placed = error_updates(fields, errors)
        if cfg is None:  # a value the schema refuses: nothing else can be worked out
            return [*placed, unplaced_errors(fields, errors), *[gr.skip()] * 9, seen]
        # every problem of the form at once, each under its field; the preview and the memory plan
        # still follow the values (memory does not depend on the dataset: issue 29 item 9)
        try:
            shell, argv, toml = studio.command_preview(cfg)
        except ConfigError as e:
            shell, argv, toml = f"# {e}", "[]", ""
        secrets = status_markdown(cfg, typed)
        msg = unplaced_errors(fields, errors)

        def family() -> str:   # the model's family for the memory plan (a single file's: a cached subprocess)
            return dv.model_family(cfg, python=studio.settings.python, cwd=studio.manager.cwd)
        dataset_refused = next((e for e in errors if str(e).startswith(("dataset.path", "dataset.subsets"))), None)
        try:
            if dataset_refused is not None:
                raise dataset_refused
            inspection = dv.inspect_dataset(cfg, python=studio.settings.python, cwd=studio.manager.cwd)
        except ConfigError as e:   # no folder, or nothing usable in it: say why, drop the old folder's views
            if e is not dataset_refused:
                placed = error_updates(fields, [*errors, e])
                msg = unplaced_errors(fields, [*errors, e])
            return [*placed, msg, dv.memory_only_markdown(cfg, family()), shell, argv, toml,
                    dv.failure_markdown(e), *dv.empty_views(), secrets, ""]
        except Exception as e:  # timeouts, a broken backend: say so, keep the page usable
            return [*placed, f"⚠️ dataset inspector failed: {e}", gr.skip(), shell, argv, toml,
                    gr.skip(), gr.skip(), gr.skip(), gr.skip(), secrets, seen]
        plan = dv.plan_markdown(cfg, inspection.counts, inspection.summary, family())
        signature = dv._signature(cfg)
        if signature == seen:
            inspector = [gr.skip()] * 4
        else:
            summary = inspection.summary
            inspector = [dv.summary_markdown(summary), dv.buckets_frame(summary), dv.tags_frame(summary),
                         dv.thumbnails(summary, max_megapixels=cfg.dataset.max_image_megapixels)]
        return [*placed, msg, plan, shell, argv, toml, *inspector, secrets, signature]

    outputs = [message, ui["plan_md"], ui["cmd_shell"], ui["cmd_argv"], ui["cmd_toml"],
               ui["inspect_md"], ui["buckets"], ui["tags"], ui["thumbs"], secret_status, inspected]
    # a user's edits only: a value set by a function (preset load, draft restore, a run's config)
    # fires no edit event; those paths chain one refresh themselves (studio.after_load)
    triggers = [trigger for widget in [*form.inputs, *secret_boxes] for trigger in edit_triggers(widget)]
    hook = on_edit or EditHook(inputs=[], outputs=[], fn=lambda values: [])

    def refresh_with_visibility(*args):
        """The refresh, plus only the options that apply to the current values shown (fields with a
        problem highlighted); error lines and cells the browser already shows that way are skipped;
        then the edit hook's outputs."""
        split = len(args) - len(hook.inputs)
        extra = list(args[split:])
        *args, previous, refused_values = args[:split]
        out = refresh(*args)
        n = len(fields)
        if refused_values is not None and refused_values == list(args[:n]):
            # a refresh of the values Start refused (the page load's, a blur sent before Start): Start's
            # message stays until the user changes something (issue 29 item 1)
            out[n] = gr.skip()
        visible = field_visibility(fields, list(args[:n]))
        form_updates, keys = only_changed([*out[:n], *form.visibility_updates(visible, shown_errors(out[:n]))],
                                          previous)
        return [*form_updates[:n], *out[n:], *form_updates[n:], keys, *hook.fn(list(args[:n]), *extra)]

    refresh_with_visibility = form.reading(refresh_with_visibility)
    gr.on(triggers, refresh_with_visibility, inputs=[form.values, *secret_boxes, inspected, shown, refused,
                                                     *hook.inputs],
          outputs=[*form.errors, *outputs, *form.visibility_outputs, shown, *hook.outputs], trigger_mode="always_last",
          show_progress="hidden", concurrency_id=FORM_REFRESH, concurrency_limit=1)

    memory_warned = gr.State(None)

    def on_start(*args, front: bool = True):
        """Start = the job at the front of the queue (it runs when its GPUs are free); Add to queue
        (`front=False`) = at the end, and the page stays here."""
        args, warned_at = args[:-1], args[-1]
        values = list(args[:len(fields)])   # what a refusal is about (`refused`)
        visible = field_visibility(fields, values)

        def cleared():
            return [*error_updates(fields, None), *form.visibility_updates(visible)]

        cfg, errors = form_problems(fields, list(args[:len(fields)]))
        error = errors[0] if errors else None
        if error is None:
            warning = dv.start_memory_warning(cfg, warned_at, time.time(),
                                              dv.model_family(cfg, python=studio.settings.python,
                                                              cwd=studio.manager.cwd))
            if warning:   # the memory plan says it will not fit the card: warn first, start on a second press
                return [*cleared(), f"⚠️ {warning}", gr.skip(), gr.skip(), time.time(),
                        only_changed(cleared(), None)[1], values]
            try:
                run_dir = studio.manager.start(cfg, secret_env=env_from_rows(list(args[len(fields):])), front=front)
            except ConfigError as e:
                error = e
            except StartRefused as e:
                return [*cleared(), f"⚠️ {e}", gr.skip(), gr.skip(), None, only_changed(cleared(), None)[1], values]
            else:
                if not front:
                    return [*cleared(), f"Added **{run_dir.name}** to the queue (the Queue page shows its place).",
                            gr.skip(), gr.skip(), None, only_changed(cleared(), None)[1], None]
                return [*cleared(), f"Started **{run_dir.name}** — follow it on the Run page.",
                        gr.skip(), gr.Tabs(selected="run"), None, only_changed(cleared(), None)[1], None]
        target = error_field(fields, error)
        hint = f" (tab {target.tab})" if target else ""
        more = f" (and {len(errors) - 1} more, shown under their fields)" if len(errors) > 1 else ""
        placed = [*error_updates(fields, errors or error)]
        placed += form.visibility_updates(visible, shown_errors(placed))
        return [*placed, f"⚠️ Not started: {error}{hint}{more}",
                gr.Tabs(selected=tab_id(target.tab)) if target else gr.skip(), gr.skip(), None,
                only_changed(placed, None)[1], values]

    def add_to_queue(*args):
        return on_start(*args, front=False)
    for button, handler in ((start, on_start), (enqueue, add_to_queue)):
        button.click(form.reading(handler),
                     inputs=[form.values, *secret_boxes, memory_warned],
                     outputs=[*form.errors, *form.visibility_outputs, message, form.tabs, main_tabs, memory_warned,
                              shown, refused],
                     show_progress_on=message,
                     # in turn with the form's refresh: a refresh sent before Start (the blur of the field
                     # just typed in) finishes first, and never blanks Start's refusal (issue 29 item 1)
                     concurrency_limit=1, concurrency_id=FORM_REFRESH)
    return TrainingPage(form=form, message=message,
                        refresh_outputs=[*outputs, *form.visibility_outputs, shown, *hook.outputs],
                        refresh=refresh_with_visibility,
                        inspected=inspected, start_button=start, secret_boxes=secret_boxes,
                        shown=shown, edit_hook=hook, refused=refused)

