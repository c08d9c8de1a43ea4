"""Assemble the studio: Training, Run, Runs and Queue pages in one Blocks app."""
from __future__ import annotations

import tomllib

import gradio as gr

from trainer_backend.config import ConfigError, from_dict

from gui.shared_state import Studio, overlay
from gui.form_draft import FormDraft
from gui.datasets_page import KEYS_JS, build_datasets_page
from gui.lora_tools_page import build_lora_tools_page
from gui.preset_panel import build_preset_panel, wire_preset_panel
from gui.run_control import StartRefused
from gui.run_page import build_run_page
from gui.queue_page import build_queue_page
from gui.runs_page import build_runs_page
from gui.sample_grid import GRID_CSS
from gui.training_page import FORM_REFRESH, build_training_page

TITLE = "SD Training Studio"

CSS = """
.preset-row { align-items: flex-end !important; }
.preset-row button { margin-bottom: 6px; }
.field-error, .field-error * { color: #c0392b !important; font-weight: 600; }
.field-error p { margin: 0; }
.field-invalid input, .field-invalid textarea, .field-invalid select, .field-invalid .wrap {
  border-color: #c0392b !important; box-shadow: 0 0 0 1px #c0392b !important; }
.field-invalid label > span, .field-invalid [data-testid="block-info"] { color: #c0392b !important; }
.section-title h4 { margin: 10px 0 0 0; }
.toml-field textarea, .run-log textarea { font-family: ui-monospace, SFMono-Regular, Menlo, monospace;
  font-size: 12px; }
.run-progress { padding: 8px 4px; }
.run-progress .run-status { font-weight: 700; font-size: 1.1em; margin-bottom: 6px; }
.run-progress .bar { height: 14px; border-radius: 7px; background: var(--neutral-200); overflow: hidden; }
.run-progress .fill { height: 100%; background: var(--color-accent); transition: width .5s; }
.run-progress .numbers { margin-top: 6px; font-variant-numeric: tabular-nums; }
.status-error .run-status { color: #c0392b; }
.run-warning { background: #fdf2e0; color: #8a5300; border-left: 4px solid #e0a030; padding: 6px 10px; margin-bottom: 6px; }
.status-stopped .run-status, .status-preempted .run-status, .status-interrupted .run-status { color: #b9770e; }
.status-done .run-status { color: #1e8449; }
.gradio-container { overflow: clip !important; }  /* clips as "hidden" did, but lets #start-row stick */
#start-row { position: sticky; bottom: 0; z-index: 20; background: var(--background-fill-primary);
  padding: 6px 0; box-shadow: 0 -2px 6px rgba(0, 0, 0, 0.08); }
""" + GRID_CSS


def families_text() -> str:
    """The families the studio trains, from the registry (the header names them all)."""
    from trainer_backend.families.registry import FAMILIES
    labels = [e.label.split(" (")[0] for e in FAMILIES]   # "Flux.1 (dev, schnell)": "Flux.1"
    return ", ".join(labels[:-1]) + " and " + labels[-1]


def start_from_toml(studio: Studio, config_toml: str) -> str:
    """API: start a run from TOML text (a preset or a full config) on top of the studio's
    defaults. Returns the run directory, or 'error: ...'."""
    try:
        cfg = from_dict(overlay(studio.base(), tomllib.loads(config_toml)))
        return str(studio.manager.start(cfg))
    except (ConfigError, StartRefused, tomllib.TOMLDecodeError) as e:
        return f"error: {e}"


def build_app(studio: Studio) -> gr.Blocks:
    label, values = studio.initial_values()
    with gr.Blocks(title=TITLE, analytics_enabled=False) as app:
        gr.Markdown(f"## {TITLE}  \nLoRA, DreamBooth and full fine-tuning of {families_text()}. "
                    "The demo preset teaches a small model the colour pink on the CPU in about a minute: "
                    "press **Start training** and compare the samples before and after.",
                    elem_id="studio-title")
        with gr.Tabs(elem_id="main-tabs") as main_tabs:
            with gr.Tab("Training", id="training", elem_id="page-training") as training_tab:
                panel = build_preset_panel(studio, label)
                modified = gr.Markdown("", elem_id="form-modified")   # which fields differ from the preset
                draft = FormDraft(studio, panel.dropdown, modified)
                page = build_training_page(studio, values, main_tabs, on_edit=draft.on_edit())

            def after_load(event):
                """Values were set by a function (their fields fire no edit event): the form's values in
                the browser take them (`merge_patch`), then validate, re-plan, re-preview once and keep
                the form as the browser's draft (the refresh's edit hook)."""
                page.form.merge_patch(event).then(page.refresh, inputs=page.refresh_inputs,
                           outputs=[*page.form.errors, *page.refresh_outputs], show_progress="hidden",
                           concurrency_id=FORM_REFRESH, concurrency_limit=1)
            with gr.Tab("Run", id="run", elem_id="page-run") as run_tab:
                run_timer = build_run_page(studio, page.secret_boxes, run_tab)
            with gr.Tab("Runs", id="runs", elem_id="page-runs") as runs_tab:
                runs_timer = build_runs_page(studio, page.form, after_load, main_tabs, page.secret_boxes,
                                             runs_tab)
            with gr.Tab("Datasets", id="datasets", elem_id="page-datasets") as datasets_tab:
                datasets_timer, _ = build_datasets_page(studio, page.form, after_load, main_tabs, datasets_tab)
            with gr.Tab("LoRA tools", id="lora-tools", elem_id="page-lora-tools") as lora_tab:
                build_lora_tools_page(studio)
            pages = [(training_tab, None), (run_tab, run_timer), (runs_tab, runs_timer), (datasets_tab, datasets_timer)]
            pages.append((lora_tab, None))   # its own timer runs while one of its jobs does (gui/lora_tools_page.py)
            if studio.queue is not None:
                with gr.Tab("Queue", id="queue", elem_id="page-queue") as queue_tab:
                    pages.append((queue_tab, build_queue_page(studio, main_tabs)))
        tick_only_while_shown(pages)
        app.load(None, js=KEYS_JS)   # the caption editor's keys (gui/datasets_page.py)
        wire_preset_panel(panel, studio, page.form, after_load)
        # a reload keeps the form: the draft in the browser is restored, then the form is refreshed
        draft.wire(app, page.form, after_load)

        def start_toml(config_toml: str) -> str:
            """Start a run from TOML text (preset or full config); returns the run directory or 'error: ...'."""
            return start_from_toml(studio, config_toml)
        gr.api(start_toml, api_name="start_from_toml", concurrency_id="run-control")
    track_progress_lightly(app)
    return app


def tick_only_while_shown(pages: list[tuple[gr.Tab, gr.Timer | None]]) -> None:
    """A page's refresh timer runs while its tab is shown, the others' stop (a tab selected by a
    button, as Start selects the Run page, fires `select` too). Gradio keeps a tab's components,
    its timer among them, once the tab has been shown: after a look at the Run page an idle Runs
    page cost the browser 20 CPU-s in 20 s with both ticking, 9 with its own alone (docs/gui.md,
    Run page)."""
    timers = [timer for _, timer in pages if timer is not None]

    def switch_to(own: gr.Timer | None):
        return lambda: [gr.Timer(active=timer is own) for timer in timers]
    for tab, own in pages:
        tab.select(switch_to(own), outputs=timers, show_progress="hidden")


def track_progress_lightly(app: gr.Blocks) -> None:
    """The page updates the loading status of every progress target of every event that has run,
    on every status change of any event, each update searching the ~900 components: with the form's
    fields as targets, a preset load spent most of its seconds there (docs/gui.md). An event that
    shows no progress tracks its first output here; the ones that show it name their message
    (`show_progress_on`), where tests/test_gui_responsiveness.py checks both."""
    for fn in app.fns.values():
        if fn.show_progress_on is None and len(fn.outputs) > 1 and fn.show_progress == "hidden":
            fn.show_progress_on = [fn.outputs[0]]
