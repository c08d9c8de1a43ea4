"""The Datasets page's "Caption with a model" panel: starts the caption job of
trainer_backend.captioners (its own process; a queue job when the studio has a queue) on the open
dataset and shows its progress. Every caption it writes is an entry of the dataset's undo journal,
so the page's Undo reverts a batch. The options' choices and help come from CaptionOptions' fields."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import gradio as gr

from trainer_backend.captioners import CaptionOptions, caption_progress, queue_caption_job, start_caption_job, \
    stop_caption_job
from trainer_backend.workbench.library import LibraryError

FIELDS = {f.name: f for f in dataclasses.fields(CaptionOptions)}


def caption_options(folder: Path, runs_dir: Path, model: str, trigger: str, existing: str, target: str,
                    length: str, caption_extension: str = ".txt") -> CaptionOptions:
    """The job's options: the dataset, its job folder under the runs folder, what the panel set."""
    if not (model or "").strip():
        raise LibraryError("captioner: give a model (a folder, a hub id, or builtin:tiny-caption-florence2)")
    return CaptionOptions(dataset=str(folder), model=model.strip(), trigger=(trigger or "").strip(),
                          existing=existing, target=target, length=length, caption_extension=caption_extension,
                          job_dir=str(Path(runs_dir) / f"caption-{Path(folder).name}"))


def start(studio, options: CaptionOptions) -> Path:
    """Through the studio's queue when it has one, else as its own process; returns the job folder."""
    queue = getattr(studio, "queue", None)
    if queue is not None:
        queue_caption_job(queue, options)
        return Path(options.job_dir)
    return start_caption_job(options, python=studio.settings.python)


def progress_markdown(job_dir: Path | None) -> str:
    if job_dir is None:
        return ""
    p = caption_progress(job_dir)
    if p.state == "not started":
        return f"Captioning: waiting to start (`{job_dir}`)."
    line = f"Captioning **{p.state}**: {p.done}/{p.total} images"
    if p.state == "running" and p.eta_s is not None:
        line += f", about {p.eta_s:.0f} s left"
    if p.message:
        line += f"  \n⚠️ {p.message}"
    if p.state == "done":
        line += " · **Undo the last edit** reverts its last batch"
    return line


def _widget(name: str, label: str, **kwargs):
    f = FIELDS[name]
    choices = f.metadata.get("choices") or ()
    if choices:
        return gr.Dropdown(choices=list(choices), value=f.default, label=label, info=f.metadata["help"], **kwargs)
    return gr.Textbox(value=f.default, label=label, info=f.metadata["help"], **kwargs)


def build_caption_panel(page, chooser, settings, message, timer) -> None:
    """page: gui.datasets_page.DatasetsPage."""
    with gr.Accordion("Caption with a model", open=False):
        with gr.Row(equal_height=True):
            model = _widget("model", "Captioner", elem_id="ds-cap-model", scale=3)
            trigger = _widget("trigger", "Trigger word", elem_id="ds-cap-trigger", scale=1)
            existing = _widget("existing", "Images with a caption", elem_id="ds-cap-existing", scale=1)
            target = _widget("target", "Style", elem_id="ds-cap-target", scale=1)
            length = _widget("length", "Length", elem_id="ds-cap-length", scale=1)
        with gr.Row():
            go = gr.Button("Start captioning", variant="primary", elem_id="ds-cap-start")
            halt = gr.Button("Stop captioning", elem_id="ds-cap-stop")
        status = gr.Markdown("", elem_id="ds-cap-status")
    job = gr.State(None)

    def on_start(chosen, settings_value, model_value, trigger_value, existing_value, target_value, length_value):
        try:
            folder = page.folder_of(chosen)
            ext = settings_value.get("caption_extension") or ".txt"
            options = caption_options(folder, page.studio.settings.runs_dir, model_value, trigger_value,
                                      existing_value, target_value, length_value, ext)
            job_dir = start(page.studio, options)
        except (LibraryError, ValueError, OSError) as e:
            return f"⚠️ {e}", gr.skip(), gr.skip()
        return f"Started captioning `{folder.name}` (job folder `{job_dir}`).", str(job_dir), progress_markdown(job_dir)
    go.click(on_start, inputs=[chooser, settings, model, trigger, existing, target, length],
             outputs=[message, job, status], concurrency_id="ds-edit")

    def on_stop(job_value):
        if not job_value:
            return "No caption job was started from this page."
        return "Stopping: the batch in hand is written first." if stop_caption_job(Path(job_value)) else \
            "The caption job is not running."
    halt.click(on_stop, inputs=job, outputs=status)
    timer.tick(lambda job_value: progress_markdown(Path(job_value)) if job_value else gr.skip(), inputs=job,
               outputs=status, show_progress="hidden")
