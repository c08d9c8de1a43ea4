"""The Run page's "Sample at strengths": the shown run's LoRA output or one of its checkpoints drawn at several
strengths as a job of the queue (trainer_backend/lora_tools/jobs.py); the images join the run's sample grid
as columns "my-lora.safetensors ×0.75" when the job is done. No torch here: the job runs in its own process."""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from trainer_backend.errors import ConfigError
from trainer_backend.lora_tools.jobs import DEFAULT_STRENGTHS, queue_sample_job
from trainer_backend.run.checkpoint_files import list_checkpoints

from gui.run_state import snapshot
from gui.shared_state import Studio


def sources(run_dir: Path | None) -> list[tuple[str, str]]:
    """(label, path): the run's adapter outputs, then its checkpoints, newest first."""
    if not run_dir or not Path(run_dir).is_dir():
        return []
    run_dir = Path(run_dir)
    found = [(f"output: {Path(p).name}", str(p)) for p in snapshot(run_dir).outputs
             if str(p).endswith(".safetensors") and Path(p).is_file()]
    found += [(f"checkpoint: {c.name}", str(c)) for c in reversed(list_checkpoints(run_dir))]
    return found


def submit(studio: Studio, run: str, source: str, strengths: str) -> str:
    if not run:
        return "No run shown."
    if studio.queue is None:
        return "⚠️ This studio runs no job queue; use `python -m trainer_backend lora sample --run …`."
    try:
        job = queue_sample_job(studio.queue, Path(run), source or "", strengths or DEFAULT_STRENGTHS)
    except ConfigError as e:
        return f"⚠️ {e}"
    what = Path(source).name if source else "the run's output"
    return (f"Queued job {job.id}: {what} at {strengths} ({studio.queue.place(job)}). The images appear in the "
            f"sample grid as new columns when it is done; its progress is on the Queue page.")


def build_strengths_panel(studio: Studio, shown: gr.State) -> None:
    """An accordion under the grid; its choices are read when it opens."""
    with gr.Accordion("Sample at strengths (after the run)", open=False, elem_id="run-strengths") as panel:
        with gr.Row():
            source = gr.Dropdown(label="LoRA or checkpoint", choices=[], value=None, elem_id="run-strengths-source",
                                 info="empty: the run's output file")
            strengths = gr.Textbox(label="Strengths", value=DEFAULT_STRENGTHS, elem_id="run-strengths-values",
                                   info="comma-separated; 0 draws the base model")
            go = gr.Button("Sample at these strengths", elem_id="run-strengths-go")
        note = gr.Markdown("", elem_id="run-strengths-message")
    panel.expand(lambda run: gr.update(choices=sources(Path(run) if run else None), value=None), inputs=shown,
                 outputs=source, show_progress="hidden")
    go.click(lambda run, src, values: submit(studio, run, src, values), inputs=[shown, source, strengths],
             outputs=note, concurrency_id="run-control")
