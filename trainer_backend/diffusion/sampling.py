"""Sample images during training: when, from which prompts, and without disturbing training.

Prompts are lines like kohya's: `a photo of sks dog --n blurry --w 512 --h 768 --d 7 --s 28 --l 6`
(negative prompt, width, height, seed, steps, CFG scale); `--control <image>` gives an edit model's prompt
its control image (passed to the pipeline as the family's control_image_argument). Images are made on the main process
with the current weights (or the EMA's), each from its own seeded generator, and saved as
`<run>/samples/step-XXXXXXXX_pNN.png`; a `sample` event lists them and TensorBoard shows them.
The global RNG states and the modules' train/eval modes are restored afterwards, so a run
with samples trains exactly like one without. `<run>/control/sample_now` asks for samples now.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import math
import os
import random
from pathlib import Path

import numpy as np
import torch

from ..config import ConfigError, TrainConfig
from ..config.sample_prompts import SamplePrompt, load_prompts, parse_prompt_line  # noqa: F401 (re-exported)
from ..run.contract import CONTROL_DIR, SAMPLES_DIR, Control, Event

LOG = logging.getLogger("trainer")
TRAINING_ADAPTER = "training_adapter"  # the frozen peft adapter of network.training_adapter (methods/training_adapter.py)


@contextlib.contextmanager
def preserved_rng() -> None:
    """Save and restore python, numpy, torch and accelerator (CUDA/ROCm/MPS/XPU) RNG states around a block."""
    from ..compute.devices import accelerator_rng_state, set_accelerator_rng_state
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(), accelerator_rng_state())
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        set_accelerator_rng_state(states[3])


@contextlib.contextmanager
def eval_mode(modules: list[torch.nn.Module]):
    """Eval mode (no adapter dropout) for sampling; afterwards every submodule gets its own previous
    mode back (they can differ: peft's dropout layers train inside a model loaded in eval mode)."""
    modes = [(sub, sub.training) for m in modules for sub in m.modules()]
    try:
        for m in modules:
            m.eval()
        yield
    finally:
        for sub, training in modes:
            sub.training = training


@contextlib.contextmanager
def training_adapter_off(modules: list[torch.nn.Module]):
    """network.training_adapter is for training steps only: inside the block no peft layer computes it
    (its active list lacks it, so nothing is added: exact), afterwards each layer's active adapters and
    every requires_grad flag are as before (peft's set_adapter would make frozen adapters trainable)."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    layers = [sub for m in modules for sub in m.modules()
              if isinstance(sub, BaseTunerLayer) and TRAINING_ADAPTER in sub.active_adapters]
    flags = [(p, p.requires_grad) for layer in layers for p in layer.parameters()]
    active = [list(layer.active_adapters) for layer in layers]
    try:
        for layer, names in zip(layers, active):
            layer.set_adapter([n for n in names if n != TRAINING_ADAPTER])
        yield
    finally:
        for layer, names in zip(layers, active):
            layer.set_adapter(names)
        for p, flag in flags:
            p.requires_grad_(flag)


def autocast(device: torch.device, dtype: torch.dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def generate(pipe, device: torch.device, weight_dtype: torch.dtype, audio_out: list | None = None, **call) -> list:
    """PIL images from a pipeline call: denoising under autocast in the compute dtype, decoding by
    the fp32 VAE outside it (an fp16 VAE overflows, SDXL's above all). `audio_out`: a list that gets each
    sample's generated audio, (float (channels, samples), rate), from a pipeline that generates audio too."""
    pipe = run_on(pipe, device)  # on `device` even where the VAE or text encoders wait in CPU memory
    with autocast(device, weight_dtype):
        out = pipe(output_type="latent", **call)
    if audio_out is not None and getattr(out, "audio", None) is not None:
        audio_out.extend(decode_audio(pipe, out.audio))
    latents = out.images if hasattr(out, "images") else out.frames  # a video pipeline's output has frames
    vae = pipe.vae
    cfg = vae.config
    latents = latents.to(vae.dtype)
    if hasattr(pipe, "latents_to_vae"):  # a family's own unpacking (families/ideogram4: normalised tokens)
        images = vae.decode(pipe.latents_to_vae(latents, call["height"], call["width"]), return_dict=False)[0]
        return pipe.image_processor.postprocess(images.float(), output_type="pil")
    if latents.ndim == 3 and hasattr(pipe, "_unpack_latents"):  # Flux: 2x2-packed tokens back to an image grid
        size = (call["height"], call["width"])  # Krea 2's takes no scale factor (its own patch size instead)
        takes_scale = len(inspect.signature(pipe._unpack_latents).parameters) > 3
        latents = pipe._unpack_latents(latents, *size, *((pipe.vae_scale_factor,) if takes_scale else ()))
    mean, std = getattr(cfg, "latents_mean", None), getattr(cfg, "latents_std", None)
    if mean is not None and std is not None:  # as the SDXL and Qwen-Image pipelines decode
        shape = (1, -1) + (1,) * (latents.ndim - 2)  # Qwen-Image: [B, C, frames, H, W]
        scaling = getattr(cfg, "scaling_factor", None) or 1.0
        latents = latents * torch.tensor(std).view(shape).to(latents) / scaling + \
            torch.tensor(mean).view(shape).to(latents)
    else:
        latents = latents / getattr(cfg, "scaling_factor", 1.0) + (getattr(cfg, "shift_factor", None) or 0.0)
    images = vae.decode(latents, return_dict=False)[0]
    if images.ndim == 5 and call.get("num_frames", 1) > 1:  # a clip: uint8 frames (F, H, W, 3) per sample
        frames = ((images.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
        return [clip.permute(1, 2, 3, 0).cpu().numpy() for clip in frames]
    if images.ndim == 5:  # a video autoencoder's one frame
        images = images[:, :, 0]
    processor = getattr(pipe, "image_processor", None) or pipe.video_processor  # video pipelines have the latter
    return processor.postprocess(images.float(), output_type="pil")


def decode_audio(pipe, audio_latents: torch.Tensor) -> list[tuple]:
    """A pipeline's audio latents (its output_type="latent" audio: LTX2Pipeline's [B, C, L, M]) -> per sample
    (float32 (channels, samples) in [-1, 1], rate), through its audio VAE and vocoder as the pipeline decodes."""
    mel = pipe.audio_vae.decode(audio_latents.to(pipe.audio_vae.dtype), return_dict=False)[0]
    waves = pipe.vocoder(mel.to(next(pipe.vocoder.parameters()).dtype)).float().clamp(-1, 1).cpu().numpy()
    rate = int(pipe.vocoder.config.output_sampling_rate)
    return [(wave.reshape(-1, wave.shape[-1]), rate) for wave in waves]


def frame_count(frames: int, step: int) -> int:
    """The nearest count at or below `frames` that follows a video family's rule k * step + 1 (at least 1)."""
    return max(0, frames - 1) // step * step + 1 if step > 0 else frames


@contextlib.contextmanager
def sampling_parts(model):
    """The modules that join the device only to sample (Family.sampling_only: Wan's frozen expert) placed for
    the pipeline as the trainer set them up (model.sampling_placement), and home afterwards."""
    placement = getattr(model, "sampling_placement", None)
    with placement() if placement is not None else contextlib.nullcontext():
        try:
            yield
        finally:
            model.family.after_sampling(model)


def run_on(pipe, device: torch.device):
    """The pipeline with its execution device fixed to `device`. diffusers takes it from the first
    module's weights, which memory.offload_encoders keeps in CPU memory (their hooks move each call's
    inputs to the device)."""
    if getattr(type(pipe), "_runs_on", None) != device:
        base = getattr(type(pipe), "_pipeline_class", type(pipe))
        pipe.__class__ = type(base.__name__, (base,), {"_execution_device": property(lambda self: device),
                                                       "_runs_on": device, "_pipeline_class": base})
    return pipe


def save_png(image, path: Path) -> None:
    tmp = path.with_name(path.name + ".partial")
    image.save(tmp, format="PNG")
    os.replace(tmp, path)


def control_images(prompts: list[SamplePrompt], family, cfg: TrainConfig) -> list:
    """Each prompt's control image (RGB PIL; a list of them for several references; or None), loaded
    before training so a bad file stops the run at once, and checked against the family now that it is
    known (model.arch = auto)."""
    from ..config.paths import resolve_path
    from ..data.images import BadImage, load_rgb
    out = []
    for p in prompts:
        if family.control_images == "required" and not p.control:
            raise ConfigError(f"samples.prompts: {p.prompt!r}: {family.name} is an edit model: add --control "
                              f"<image file> to every sample prompt")
        if family.control_images == "" and p.control and not family.takes_start_image:
            raise ConfigError(f"samples.prompts: {p.prompt!r}: --control: {family.name} takes no control image")
        if len(p.controls) > family.max_control_images:
            raise ConfigError(f"samples.prompts: {p.prompt!r}: {len(p.controls)} --control images; {family.label} "
                              f"takes at most {family.max_control_images}")
        if not p.control:
            out.append(None)
            continue
        images = []
        for control in p.controls:
            try:
                images.append(load_rgb(Path(resolve_path(control)).expanduser(),
                                       int(cfg.dataset.max_image_megapixels * 1e6), cfg.dataset.alpha_background))
            except (BadImage, OSError) as e:
                raise ConfigError(f"samples.prompts: --control {control}: {e}") from None
        out.append(images[0] if len(images) == 1 else images)
    return out


class SampleImages:
    """Decides when to sample (maybe_sample) and does it (sample)."""

    def __init__(self, cfg: TrainConfig, run, model, accelerator, weight_dtype: torch.dtype, ema=None,
                 trainable=None, adapter_switch=None, caption: str = ""):
        """trainable, adapter_switch (methods.adapter_switch): the adapters whose effect each round measures
        (samples.check_adapter_effect);
        caption: the prompt of the final check when there are no sample prompts (the first training caption)."""
        from .adapter_effect import make_adapter_effect
        self.cfg, self.run, self.model, self.accelerator = cfg, run, model, accelerator
        self.weight_dtype, self.ema = weight_dtype, ema
        self.effect = make_adapter_effect(trainable.modules.values(), adapter_switch) \
            if trainable is not None and cfg.samples.check_adapter_effect else None
        self.caption, self.measured, self.warned = caption, None, set()
        self.prompts = load_prompts(cfg)
        self.check_schedule(cfg, self.prompts)
        self.enabled = getattr(model, "denoiser", None) is not None  # a VAE run has nothing to sample with
        self.controls = control_images(self.prompts, model.family, cfg) if self.enabled else []
        self.dir = Path(run.dir) / SAMPLES_DIR
        self.control = Path(run.dir) / CONTROL_DIR / Control.SAMPLE_NOW.value
        self.last_step = -1
        self.last_audio: list | None = None  # the last render's generated audio (a model with an audio stream)

    @staticmethod
    def check_schedule(cfg: TrainConfig, prompts: list[SamplePrompt]) -> None:
        s = cfg.samples
        if not prompts and (s.every_n_steps or s.every_n_epochs or s.before_first_step):
            raise ConfigError("samples.prompts: no prompts, but sampling is scheduled (samples.every_n_steps, "
                              "every_n_epochs or before_first_step); add prompts or samples.prompt_file")

    def due(self, step: int, *, epoch: int | None = None, before_training: bool = False) -> bool:
        s = self.cfg.samples
        if step == self.last_step:
            return False
        if before_training:
            return s.before_first_step and step == 0
        if epoch is not None:
            return bool(s.every_n_epochs) and epoch % s.every_n_epochs == 0
        return bool(s.every_n_steps) and step % s.every_n_steps == 0

    def maybe_sample(self, state, *, epoch_end: bool = False, before_training: bool = False) -> list[Path]:
        """Call before training, after every optimizer step, and at each epoch's end (state.epoch is then
        the number of finished epochs). Only the main process samples; the others go on. The event's
        epoch is 1-based like the step events' (the epoch in progress, or the one just finished)."""
        if not self.accelerator.is_main_process or not self.enabled:
            return []
        step = state.global_step
        asked = not before_training and not epoch_end and self._take_request()
        if not (asked or self.due(step, epoch=state.epoch if epoch_end else None, before_training=before_training)):
            return []
        if not self.prompts:
            LOG.warning("samples: sample_now asked, but there are no prompts (samples.prompts)")
            return []
        return self.sample(step, state.epoch if epoch_end or before_training else state.epoch + 1)

    def _take_request(self) -> bool:
        if not self.control.exists():
            return False
        self.control.unlink(missing_ok=True)
        return True

    def render(self, pipe, p: SamplePrompt, control) -> object:
        """One PIL image of prompt p from its own seeded generator."""
        model = self.model
        prompts = model.family.prompt_arguments(model, p.prompt, p.negative or None)
        # the family's own call options, a prompt's --control image over any default image among them
        control = {**model.family.pipeline_call_options(model),
                   **({model.family.control_image_argument: control} if control else {})}
        family = model.family
        # a video family's sample is a clip: `--f` frames, else the family's default (rounded to its rule)
        frames = {"num_frames": frame_count(p.frames or family.sample_frames, family.frame_step)} \
            if family.frame_step else {}
        # a model with an audio stream trained on the clips' audio: the sample clip carries the generated audio
        self.last_audio = [] if family.audio_stream and self.cfg.dataset.video_audio else None
        (image,) = generate(pipe, self.accelerator.device, self.weight_dtype, self.last_audio, **prompts, **control,
                            **frames, width=p.width,
                            height=p.height, num_inference_steps=p.steps,
                            **model.family.guidance_arguments(model, p.cfg_scale),
                            generator=torch.Generator("cpu").manual_seed(p.seed))
        return image

    @contextlib.contextmanager
    def sampling(self, use_ema: bool = False):
        """The pipeline, with training's RNG, modes and weights untouched afterwards."""
        model = self.model
        with preserved_rng(), eval_mode([model.denoiser, *model.text_encoders]), \
                (self.ema.applied() if use_ema else contextlib.nullcontext()), torch.no_grad(), \
                training_adapter_off([model.denoiser]), sampling_parts(model):
            yield model.family.build_pipeline(model, self.cfg.samples.scheduler)

    def sample(self, step: int, epoch: int) -> list[Path]:
        use_ema = bool(self.ema is not None and self.ema.active and self.cfg.ema.use_for_samples)
        self.dir.mkdir(parents=True, exist_ok=True)
        paths: list[Path] = []
        rows: list[int] = []  # the prompt of each path (a clip has two: its mp4 and its frame strip)
        images: dict[int, object] = {}
        with self.sampling(use_ema) as pipe:
            for i, p in enumerate(self.prompts):
                image = images[i] = self.render(pipe, p, self.controls[i])
                stem = self.dir / f"step-{step:08d}_p{i:02d}"
                if isinstance(image, np.ndarray) and image.ndim == 4:  # a clip: mp4 + its frame strip
                    from ..data.video import frame_strip, write_sample
                    audio = self.last_audio[0] if self.last_audio else None
                    written = write_sample(stem, image, fps=round(self.model.family.default_fps), audio=audio)
                    paths, rows = paths + written, rows + [i] * len(written)
                    self.run.events.image(f"samples/p{i:02d}", np.asarray(frame_strip(image)), step)
                    continue
                path = stem.with_name(stem.name + ".png")
                save_png(image, path)
                self.run.events.image(f"samples/p{i:02d}", np.asarray(image), step)
                paths.append(path)
                rows.append(i)
            measured = self.measure(pipe, step, images, self.prompts, self.controls, final=False)
        self.last_step = step
        self.run.events.emit(Event.SAMPLE, step=step, epoch=epoch, paths=[str(p) for p in paths],
                             **({"rows": rows} if len(rows) != len(self.prompts) else {}),
                             prompts=[p.prompt for p in self.prompts], ema=use_ema, **measured)
        LOG.info("samples at step %d%s: %s", step, " (EMA weights)" if use_ema else "", self.dir)
        return paths

    def measure(self, pipe, step: int, images: dict, prompts: list, controls: list, *, final: bool) -> dict:
        """The adapter's effect on this round's images (diffusion/adapter_effect.py); warnings as events."""
        if self.effect is None:
            return {}
        from .adapter_effect import findings, is_flat
        effect, norm = self.effect.measure(images, lambda i: self.render(pipe, prompts[i], controls[i]))
        flat = any(is_flat(image) for image in images.values())
        self.measured = (step, effect, norm, flat)
        self.warn(step, findings(effect, norm, flat, step, final), effect, norm)
        return {"adapter_effect": round(effect, 6) if math.isfinite(effect) else effect,
                "adapter_norm": round(norm, 6) if math.isfinite(norm) else norm}

    def warn(self, step: int, found: list, effect: float, norm: float) -> None:
        for f in found:
            if f.cause in self.warned:  # once per cause: a broken run would repeat it every round
                continue
            self.warned.add(f.cause)
            LOG.warning("%s", f.message)
            self.run.events.emit(Event.WARNING, step=step, cause=f.cause, message=f.message,
                                 adapter_effect=effect, adapter_norm=norm)

    def final_check(self, state) -> dict:
        """After the outputs are written: the adapter's effect on the first prompt (or the first training
        caption), as an `adapter_effect` event; a near-zero, NaN or flat result is a warning."""
        if self.effect is None or not self.enabled or not self.accelerator.is_main_process:
            return {}
        step = state.global_step
        if self.measured is not None and self.measured[0] == step:  # this step's sample round measured it
            _, effect, norm, flat = self.measured
            from .adapter_effect import findings
            self.warn(step, findings(effect, norm, flat, step, final=True), effect, norm)
        else:
            prompts, controls = self.prompts[:1], self.controls[:1]
            if not prompts:
                if self.model.family.control_images == "required":  # an edit model needs a control image
                    return {}
                from ..config.sample_prompts import defaults_of
                from dataclasses import replace
                prompts, controls = [replace(defaults_of(self.cfg), prompt=self.caption, seed=self.cfg.samples.seed)], [None]
            try:
                with self.sampling() as pipe:
                    image = self.render(pipe, prompts[0], controls[0])
                    self.measure(pipe, step, {0: image}, prompts, controls, final=True)
            except Exception as e:  # a check must never fail a run whose outputs are written
                LOG.warning("the adapter-effect check could not draw its sample (%s: %s); skipped",
                            type(e).__name__, e)
                return {}
            _, effect, norm, flat = self.measured
        fields = {"step": step, "adapter_effect": effect, "adapter_norm": norm, "flat": flat}
        self.run.events.emit(Event.ADAPTER_EFFECT, **fields)
        LOG.info("adapter effect at the end: mean image difference %.4g with vs without it, weight norm %.4g",
                 effect, norm)
        return fields
