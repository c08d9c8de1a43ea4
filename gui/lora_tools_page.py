"""The LoRA tools page: pick LoRA files inside the studio's run folders (--runs-dir, --allow-output-dir), see
`lora inspect`'s report, run merge / mix / resize / extract / post-hoc EMA as a job of the queue and see its
progress and output path. The tools run in their own processes (`python -m trainer_backend lora …`,
trainer_backend/lora_tools/jobs.py): this page imports no torch. docs/lora-tools.md."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import gradio as gr

from trainer_backend.errors import ConfigError
from trainer_backend.lora_tools.jobs import TOOLS_DIR, job_result, queue_tool_job
from trainer_backend.run.checkpoint_files import list_checkpoints

from gui.shared_state import Studio

RUN_TOOLS = ("merge", "mix", "resize", "extract", "ema")
MAX_LISTED = 2000          # files listed in the pickers
INSPECT_TIMEOUT_S = 600    # --base loads the model
SKIPPED_PARTS = {"checkpoints", ".thumbs", "tb", "control"}


def roots(studio: Studio) -> list[Path]:
    """The folders the page reads LoRA files from and writes outputs into."""
    found = [Path(studio.settings.runs_dir), *studio.settings.allowed_output_dirs]
    return list(dict.fromkeys(p.expanduser().resolve() for p in found))


def lora_files(studio: Studio) -> list[str]:
    """Every .safetensors file under the roots (not inside checkpoints or unfinished writes), newest first."""
    found = []
    for root in roots(studio):
        if not root.is_dir():
            continue
        for path in root.rglob("*.safetensors"):
            if SKIPPED_PARTS & set(path.relative_to(root).parts) or path.is_symlink():
                continue
            found.append(path)
            if len(found) >= MAX_LISTED:
                break
    found.sort(key=lambda p: p.stat().st_mtime if p.exists() else 0, reverse=True)
    return [str(p) for p in found]


def runs_with_checkpoints(studio: Studio) -> list[str]:
    out = []
    for root in roots(studio):
        if root.is_dir():
            out += [str(d) for d in sorted(root.iterdir()) if d.is_dir() and len(list_checkpoints(d)) >= 2]
    return out


def inside_roots(studio: Studio, path: str, what: str) -> Path:
    found = Path(path).expanduser().resolve()
    if not any(found == r or found.is_relative_to(r) for r in roots(studio)):
        raise ConfigError(f"{what}: {path} is outside the studio's run folders ({', '.join(map(str, roots(studio)))})")
    return found


def output_path(studio: Studio, name: str) -> Path:
    """<runs-dir>/lora-tools/out/<name>.safetensors (a plain name: letters, digits, . _ -)."""
    name = name.strip().removesuffix(".safetensors")
    if not re.fullmatch(r"[\w.-]+", name) or name.startswith("."):
        raise ConfigError(f"output name: {name!r}: use letters, digits, '.', '_' and '-'")
    return roots(studio)[0] / TOOLS_DIR / "out" / f"{name}.safetensors"


def weighted(files: list[str], weights: str) -> list[str]:
    """FILE:WEIGHT per picked file; weights comma-separated in the same order (missing ones are 1)."""
    values = [w.strip() for w in (weights or "").split(",") if w.strip()]
    for w in values:
        try:
            float(w)
        except ValueError:
            raise ConfigError(f"weights: {w!r} is not a number (e.g. 1, 0.7)") from None
    return [f"{f}:{values[i] if i < len(values) else '1'}" for i, f in enumerate(files)]


def tool_args(studio: Studio, tool: str, files: list[str], weights: str, base: str, tuned: str, run: str,
              rank: float, energy: float, sigma: str, out_name: str) -> list[str]:
    """The CLI arguments of one tool from the page's fields (ConfigError naming the field)."""
    files = [str(inside_roots(studio, f, "LoRA files")) for f in files or []]
    out = output_path(studio, out_name)
    need_files = {"merge": 1, "mix": 1, "resize": 1}
    if tool in need_files and len(files) < need_files[tool]:
        raise ConfigError("LoRA files: pick at least one file")
    if tool in ("merge", "mix", "resize", "extract") and not base.strip():
        raise ConfigError("base model: give the base model (a folder, a single file or builtin:tiny-<family>)")
    if tool == "merge":
        return ["--base", base, *[a for f in weighted(files, weights) for a in ("--lora", f)],
                "--out", str(out.with_suffix(""))]
    if tool == "mix":
        return [*weighted(files, weights), "--base", base, "--rank", str(int(rank or 0)), "--out", str(out)]
    if tool == "resize":
        if len(files) != 1:
            raise ConfigError("LoRA files: resize takes one file")
        size = ["--energy", str(energy)] if energy else ["--rank", str(int(rank or 0))]
        if not energy and not rank:
            raise ConfigError("rank: give a rank, or an energy to keep (e.g. 0.99)")
        return [files[0], "--base", base, *size, "--out", str(out)]
    if tool == "extract":
        if not tuned.strip() or not rank:
            raise ConfigError("tuned model: give the fine-tuned model and a rank")
        return ["--base", base, "--tuned", tuned, "--rank", str(int(rank)), "--out", str(out)]
    if tool == "ema":
        if not run:
            raise ConfigError("run: pick a run with at least two checkpoints")
        return ["--run", str(inside_roots(studio, run, "run")), "--sigma-rel", sigma or "0.1", "--out", str(out),
                *(["--base", base] if base.strip() else [])]
    raise ConfigError(f"tool: {tool!r} is not one of {', '.join(RUN_TOOLS)}")


def inspect_report(studio: Studio, file: str, base: str) -> str:
    """`lora inspect` in a process of its own (no torch here); its JSON report, or its one-line refusal."""
    if not file:
        return "Pick a file."
    try:
        path = inside_roots(studio, file, "file")
    except ConfigError as e:
        return f"⚠️ {e}"
    argv = [studio.settings.python, "-m", "trainer_backend", "lora", "inspect", str(path),
            *(["--base", base.strip()] if base.strip() else [])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=INSPECT_TIMEOUT_S,
                              cwd=str(studio.manager.cwd), env=command_env())
    except subprocess.TimeoutExpired:
        return f"⚠️ inspect took more than {INSPECT_TIMEOUT_S} s"
    if done.returncode != 0:
        errors = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
        return f"⚠️ {(errors or done.stderr.strip().splitlines()[-1:] or ['inspect failed'])[-1]}"
    report = json.loads(done.stdout)
    report.pop("rank_per_module", None)   # long; the counts per rank are shown
    return "```json\n" + json.dumps(report, indent=1) + "\n```"


def command_env() -> dict[str, str]:
    """This copy of the project first on the command's path (as the queue's commands get it)."""
    import os
    root = str(Path(__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}


def job_text(job_dir: str, status: str = "", message: str = "") -> str:
    """The job's state in words, from its folder's events and the queue's status of it (a Stop, or a crash
    that wrote no final event, shows there)."""
    if not job_dir:
        return ""
    r = job_result(Path(job_dir))
    if r["state"] == "done":
        outs = "\n".join(f"- `{o}`" for o in r["outputs"]) or "- (no files: see the report)"
        return f"**Done.** Output:\n{outs}"
    if r["state"] == "error" or status == "error":
        return f"⚠️ **Failed:** {r['message'] or message}"
    if status in ("stopped", "interrupted") or r["state"] in ("stopped", "preempted"):
        return f"{(status or r['state']).capitalize()}."
    if status == "waiting" or r["state"] == "waiting":
        return "Waiting in the queue…"
    total = r["total"]
    return f"Running… {r['step']}/{total}" if total else "Running… (loading)"


def build_lora_tools_page(studio: Studio) -> gr.Timer:
    gr.Markdown("LoRA files in the studio's run folders: inspect one, or run a tool as a job of the queue "
                "(docs/lora-tools.md). Outputs go to `<runs-dir>/lora-tools/out/`.")
    refresh = gr.Button("↻ Find files", size="sm", elem_id="lora-refresh")
    with gr.Row():
        file = gr.Dropdown(label="LoRA file", choices=[], value=None, elem_id="lora-inspect-file", scale=3)
        base = gr.Textbox(label="Base model (optional for inspect)", elem_id="lora-base", scale=2,
                          info="a diffusers folder, a single file or builtin:tiny-<family>")
    inspect = gr.Button("Inspect", elem_id="lora-inspect")
    report = gr.Markdown("", elem_id="lora-inspect-report")
    gr.Markdown("### Run a tool")
    with gr.Row():
        tool = gr.Radio(list(RUN_TOOLS), value="resize", label="Tool", elem_id="lora-tool")
        files = gr.Dropdown(label="LoRA files (merge, mix: several)", choices=[], multiselect=True,
                            elem_id="lora-files", scale=3)
        weights = gr.Textbox(label="Weights (merge, mix)", placeholder="1, 0.7", elem_id="lora-weights")
    with gr.Row():
        rank = gr.Number(label="Rank (resize, mix, extract)", value=8, precision=0, minimum=0, elem_id="lora-rank")
        energy = gr.Number(label="Energy to keep (resize; 0 = use the rank)", value=0, minimum=0, maximum=1,
                           elem_id="lora-energy")
        tuned = gr.Textbox(label="Tuned model (extract)", elem_id="lora-tuned")
        run = gr.Dropdown(label="Run (ema)", choices=[], value=None, elem_id="lora-run")
        sigma = gr.Textbox(label="σ_rel (ema)", value="0.1", elem_id="lora-sigma")
    with gr.Row():
        out_name = gr.Textbox(label="Output name", value="my-lora-tool-output", elem_id="lora-out")
        go = gr.Button("Run as a job", variant="primary", elem_id="lora-run-tool")
    job_dir = gr.State("")
    status = gr.Markdown("", elem_id="lora-job-status")
    timer = gr.Timer(2.0, active=False)

    def find():
        names = lora_files(studio)
        return gr.update(choices=names), gr.update(choices=names), gr.update(choices=runs_with_checkpoints(studio))

    refresh.click(find, outputs=[file, files, run], show_progress="hidden")
    inspect.click(lambda f, b: inspect_report(studio, f, b), inputs=[file, base], outputs=report)

    def submit(*values):
        if studio.queue is None:
            return "", "⚠️ This studio runs no job queue: use `python -m trainer_backend lora …`.", gr.skip()
        try:
            args = tool_args(studio, *values)
            job = queue_tool_job(studio.queue, values[0], args)
        except ConfigError as e:
            return "", f"⚠️ {e}", gr.skip()
        return job.run_dir, f"Queued job {job.id} ({studio.queue.place(job)})", gr.Timer(active=True)

    go.click(submit, inputs=[tool, files, weights, base, tuned, run, rank, energy, sigma, out_name],
             outputs=[job_dir, status, timer])

    def tick(folder):
        job = studio.queue.job_for(folder) if studio.queue is not None and folder else None
        text = job_text(folder, job.status if job else "", job.message if job else "")
        live = text.startswith(("Running", "Waiting"))
        return text, gr.skip() if live else gr.Timer(active=False)

    timer.tick(tick, inputs=job_dir, outputs=[status, timer], show_progress="hidden")
    return timer
