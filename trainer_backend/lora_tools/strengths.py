"""`lora sample`: a finished run's LoRA (or one of its checkpoints, or any adapter file for its base) drawn at
several strengths with the run's sample prompts and seeds, written into the run: PNGs in `<run>/samples/` and
one `sample` event per strength (with `strength` and `source`), which the Run and Runs pages' sample grid shows
as columns beside the training's steps ("my-lora.safetensors ×0.75").

The weights are set to W₀ + ΔW(strength) per adapted layer (updates.py: LoRA files, DoRA/LoHa/LoKr files,
checkpoint folders), so strength 0 is the base model. The run's folder lock is held while writing, so a run
that is training (or resumed meanwhile) is refused in one line. In a queue job (`--job-dir`) each image is a
`step` of the job's progress.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import torch

from ..errors import ConfigError
from .files import job_step, layer_weight
from .jobs import parse_strengths  # noqa: F401 (re-exported)

DEFAULT_STRENGTHS = (0.5, 0.75, 1.0, 1.25)


def image_name(source: str, strength: float, index: int) -> str:
    """samples/strength-<source>-s0.75_p00.png (the source's stem, letters, digits, . _ - only)."""
    slug = re.sub(r"[^\w.-]+", "_", Path(source).stem)[:60] or "adapter"
    return f"strength-{slug}-s{strength:g}_p{index:02d}.png"


def default_source(run_dir: Path) -> Path:
    """The run's adapter output: the newest `done` event's first output."""
    from ..jobqueue.progress import tail_events
    from ..run.contract import Event
    done = [e for e in tail_events(run_dir) if e.get("event") == Event.DONE and e.get("outputs")]
    if not done:
        raise ConfigError(f"--run {run_dir}: the run has no finished output yet; give --lora FILE or "
                          "--checkpoint DIR")
    return Path(done[-1]["outputs"][0])


def source_step(run_dir: Path, source: Path) -> int:
    """The training step the adapter is from: a checkpoint's, else the run's last."""
    from ..jobqueue.progress import run_progress
    from ..run.checkpoint_files import step_of
    if source.is_dir():
        return step_of(source)
    return int(run_progress(run_dir).get("step") or 0)


def prompts_for(cfg, lines: list[str]):
    """The run's sample prompts (their seeds), or `lines` over the run's [samples] defaults."""
    from dataclasses import replace
    from ..config.sample_prompts import defaults_of, load_prompts, parse_prompt_line
    if lines:
        try:
            return [parse_prompt_line(line, replace(defaults_of(cfg), seed=cfg.samples.seed + i))
                    for i, line in enumerate(lines)]
        except ValueError as e:
            raise ConfigError(f"--prompt: {e}") from None
    prompts = load_prompts(cfg)
    if not prompts:
        raise ConfigError("samples.prompts: the run has no sample prompts; give --prompt \"…\" (kohya-style options "
                          "--w --h --d --s --l work)")
    return prompts


@torch.no_grad()
def sample_strengths(run_dir: Path, source: Path | None = None, strengths=DEFAULT_STRENGTHS, base: str = "",
                     prompt_lines: list[str] | None = None) -> dict:
    from ..config import load_config
    from ..run.contract import CONFIG_FILE, SAMPLES_DIR, Event
    from ..run.events import RunEvents
    from ..run.run_lock import acquire
    run_dir = Path(run_dir).resolve()
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"--run {run_dir}: no {CONFIG_FILE}; not a run folder")
    cfg = load_config(str(run_dir / CONFIG_FILE))
    source = Path(source or default_source(run_dir)).expanduser().resolve()
    prompts = prompts_for(cfg, list(prompt_lines or []))
    with acquire(run_dir, by="lora sample") as _lock:   # no trainer writes the run meanwhile
        written = _draw(run_dir, cfg, source, list(strengths), base, prompts)
        events = RunEvents(run_dir, tensorboard=False)
        try:
            for event in written:
                events.emit(Event.SAMPLE, **event)
        finally:
            events.close()
    return {"run": str(run_dir), "source": str(source), "strengths": list(strengths),
            "outputs": [str(run_dir / p) for e in written for p in e["paths"]]}


def _draw(run_dir: Path, cfg, source: Path, strengths: list[float], base: str, prompts) -> list[dict]:
    """Every prompt at every strength; returns the `sample` events to write (paths relative to the run)."""
    from ..diffusion.sampling import control_images, generate, save_png
    from ..families import load_model
    from ..run.contract import SAMPLES_DIR
    from .updates import open_updates
    if base:
        model = load_model(base)
    else:   # the run's own [model] section: its VAE, tokenizer, separate text-encoder files, hub ids (cached)
        from ..families import load_configured
        from ..model_sources import resolve_config_models
        model = load_configured(resolve_config_models(cfg.model_copy(deep=True), show=False).model)
    family = model.family
    updates = open_updates(model, source)             # checked before anything is drawn
    controls = control_images(prompts, family, cfg)
    from ..compute.devices import as_device
    device = as_device()     # the machine's accelerator (CUDA, ROCm, MPS, XPU), else the CPU
    dtype = torch.bfloat16 if device.type != "cpu" else torch.float32
    for module in (model.denoiser, *model.text_encoders):
        module.to(device, dtype=dtype).eval()
    model.vae.to(device).eval()
    originals = {key: layer_weight(model, key).detach().to("cpu", copy=True) for key in updates.keys}
    pipe = family.build_pipeline(model, cfg.samples.scheduler)
    (run_dir / SAMPLES_DIR).mkdir(exist_ok=True)
    written, done, started = [], 0, time.monotonic()
    for strength in strengths:
        for key, original in originals.items():   # DoRA's ΔW depends on W₀: start each strength from it
            layer_weight(model, key).copy_(original)
        for key, update in updates.at(strength):
            w = layer_weight(model, key)
            w.copy_((originals[key].float() + update.reshape(w.shape)).to(w.dtype))
        paths = []
        for i, p in enumerate(prompts):
            call = {**family.prompt_arguments(model, p.prompt, p.negative or None),
                    **({family.control_image_argument: controls[i]} if controls[i] else {})}
            (image,) = generate(pipe, device, dtype, **call, width=p.width, height=p.height,
                                num_inference_steps=p.steps, **family.guidance_arguments(model, p.cfg_scale),
                                generator=torch.Generator("cpu").manual_seed(p.seed),
                                **family.pipeline_call_options(model))
            rel = f"{SAMPLES_DIR}/{image_name(source.name, strength, i)}"
            save_png(image, run_dir / rel)
            paths.append(rel)
            done += 1
            job_step(done, len(prompts) * len(strengths), started)
        written.append({"step": source_step(run_dir, source), "paths": paths, "prompts": [p.prompt for p in prompts],
                        "rows": list(range(len(prompts))), "strength": strength, "source": source.name,
                        "adapter": updates.kind})
    return written
