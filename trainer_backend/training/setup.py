"""Everything the loop needs before its first step: accelerator, run directory, model,
data, method, optimizer. Each piece is a small named function so loop.py stays short."""
from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import TrainConfig, save_toml, to_dict
from ..run.contract import COMMAND_FILE, CONFIG_FILE, CONTROL_DIR, Control
from ..run.events import RunEvents, setup_logging
from ..run.library_noise import route_library_loggers

LOG = logging.getLogger("trainer")
WEIGHT_DTYPES = {"no": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def make_accelerator(cfg: TrainConfig):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs
    from ..launch.argv import ddp_kwargs, process_group_kwargs

    # hardware.collective_timeout_s (slow caching on rank 0) and the hardware.ddp_* options
    kwargs = [InitProcessGroupKwargs(**process_group_kwargs(cfg)), DistributedDataParallelKwargs(**ddp_kwargs(cfg))]
    # Accumulation is done by the loop itself (see loop.py), so accelerate steps every call.
    from ..remote.wandb_tracking import log_with
    # DataLoaders are built by the loop per process and never prepared (see loop.epoch_loader).
    return Accelerator(mixed_precision=cfg.precision.mixed, gradient_accumulation_steps=1,
                       cpu=cfg.hardware.cpu, kwargs_handlers=kwargs, log_with=log_with(cfg))


@dataclass
class Run:
    cfg: TrainConfig
    dir: Path
    events: RunEvents
    is_main: bool
    started: float


def open_run(cfg: TrainConfig, accelerator, argv: list[str] | None = None) -> Run:
    run_dir = cfg.run_dir
    main = accelerator.is_main_process
    if main:
        from ..run.run_folder import claim
        claim(run_dir)  # a new folder or already a run's (ConfigError otherwise); writes the run marker
    setup_logging(run_dir, main)
    route_library_loggers()   # transformers'/diffusers' warnings into train.log, the harmless ones at DEBUG
    if main:
        save_toml(to_dict(cfg), run_dir / CONFIG_FILE)
        if not (run_dir / COMMAND_FILE).exists():  # the GUI/launcher writes the outer argv itself
            (run_dir / COMMAND_FILE).write_text(json.dumps(argv or sys.argv))
        (run_dir / CONTROL_DIR).mkdir(exist_ok=True)
        for stale in (c.value for c in Control):
            (run_dir / CONTROL_DIR / stale).unlink(missing_ok=True)
    events = RunEvents(run_dir, enabled=main, tensorboard=cfg.logging.tensorboard)
    return Run(cfg=cfg, dir=run_dir, events=events, is_main=main, started=time.time())


def load_base_model(cfg: TrainConfig, accelerator, events: RunEvents | None = None):
    from ..methods import load_method_model
    from ..model_sources import resolve_config_models
    with accelerator.main_process_first(), _without_zero3_init(accelerator):  # builtin: built once, by rank 0
        # hub ids -> the Hugging Face cache: rank 0 downloads (progress in events and the log), the others
        # then find the files cached
        main = accelerator.is_main_process
        resolve_config_models(cfg, emit=events.emit if events is not None and main else None, show=main)
        return load_method_model(cfg)


@contextlib.contextmanager
def _without_zero3_init(accelerator):
    """Under DeepSpeed ZeRO-3, transformers partitions models as they load (a collective that rank
    0 would wait on alone inside main_process_first). Frozen parts are never given to the engine,
    so everything loads whole here and the engine partitions the UNet when it is prepared."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if plugin is None:
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config
    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()


def place_model(model, cfg: TrainConfig, accelerator) -> torch.dtype:
    """Every part where training wants it: the encoders, then the denoiser (tests, benches, the probe;
    the loop places the denoiser only after the caches are built: place_encoders, place_denoiser)."""
    weight_dtype = place_encoders(model, cfg, accelerator)
    place_denoiser(model, cfg, accelerator)
    return weight_dtype


def trained_encoder_ids(cfg: TrainConfig, model) -> set[int]:
    return {id(te) for _, te in model.trained_text_encoders()} if cfg.network.train_text_encoder else set()


def place_encoders(model, cfg: TrainConfig, accelerator) -> torch.dtype:
    """The VAE and the text encoders on the device (or, with memory.offload_encoders, in CPU memory
    and moved in for each call), in the compute dtype; the VAE stays fp32 (fp16 VAEs NaN).
    model.quantize_text_encoders quantizes them on their way (compute/quantize.py). Runs before the
    denoiser is placed, so the caches are built while the device holds only the encoders (docs/memory.md,
    "The cache pass"). Returns the compute dtype."""
    from ..compute.quantize import quantize_module
    from .memory_setup import offload_encoders, offloaded_modules
    weight_dtype = WEIGHT_DTYPES[cfg.precision.mixed]
    trained = torch.float32 if cfg.network.type == "full" else weight_dtype
    keep, device = getattr(model.family, "keep_unquantized", ()), accelerator.device  # a VAE run has no family
    trained_encoders = trained_encoder_ids(cfg, model)
    offloaded = {id(m) for m in offloaded_modules(cfg, model, trained_encoders)}  # memory.offload_encoders
    model.vae.to(torch.device("cpu") if id(model.vae) in offloaded else accelerator.device, dtype=torch.float32)
    for encoder in model.text_encoders:
        quantize_module(encoder, cfg.model.quantize_text_encoders, keep=keep, key="model.quantize_text_encoders",
                        device=torch.device("cpu") if id(encoder) in offloaded else device,
                        compute_dtype=trained if id(encoder) in trained_encoders else weight_dtype)
    offload_encoders([m for m in (model.vae, *model.text_encoders) if id(m) in offloaded], accelerator.device)
    if cfg.precision.gradient_checkpointing:
        for encoder in model.text_encoders:
            if id(encoder) in trained_encoders:
                encoder.gradient_checkpointing_enable()
    return weight_dtype


def place_denoiser(model, cfg: TrainConfig, accelerator) -> None:
    """The denoiser in its training dtype on the device; model.quantize quantizes the frozen base on
    its way there (config/quantize_rules.py refused what cannot be quantized), memory.block_swap keeps
    its last blocks in CPU memory. A second call does nothing (DreamBooth's class-image generation may
    need the denoiser before the caches are built)."""
    if model.denoiser_placed:
        return
    from ..compute.quantize import quantize_module
    from ..compute.lowbit_linear import COMPUTE_KINDS  # quantized after the adapters: methods/lora.py
    from .block_swap import place_without
    from .memory_setup import swapped_blocks
    from ..compute.devices import allow_cudnn_attention
    from .attention_backends import use as use_attention
    # a full fine-tune's trained modules stay fp32 (master weights): no lossy half-precision round trip
    trained = torch.float32 if cfg.network.type == "full" else WEIGHT_DTYPES[cfg.precision.mixed]
    keep, device = getattr(model.family, "keep_unquantized", ()), accelerator.device
    if model.denoiser is not None:  # None in a VAE run, which trains the autoencoder alone
        if cfg.model.quantize not in ("none", *COMPUTE_KINDS):  # memory.block_swap's blocks quantized, then home
            quantize_module(model.denoiser, cfg.model.quantize, device=device, compute_dtype=trained, keep=keep,
                            host=swapped_blocks(cfg, model))
        elif swapped := swapped_blocks(cfg, model):  # memory.block_swap: these stay in CPU memory (block_swap.py)
            place_without(model.denoiser, swapped, device, trained)
        else:
            model.denoiser.to(device, dtype=trained)
        if cfg.precision.attention == "default":
            model.family.use_plain_attention(model)
        from .sampling_residency import place_sampling_only  # Wan 2.2 frozen expert: stored as the base, in CPU memory
        place_sampling_only(cfg, model, device, WEIGHT_DTYPES[cfg.precision.mixed])  # frozen: the compute dtype
    allow_cudnn_attention(cfg.precision.attention == "sdpa_cudnn")
    use_attention(cfg.precision.attention)  # a checked kernel (attention_backends.py), or PyTorch's own function
    if cfg.precision.gradient_checkpointing:
        (model.vae if model.denoiser is None else model.denoiser).enable_gradient_checkpointing()
    model.denoiser_placed = True


def release_cache_memory(accelerator) -> None:
    """After the cache pass: the allocator's cached blocks of the encoders' activations go back to the
    driver before the denoiser arrives (offloaded encoders are already home: their hooks move them)."""
    import gc

    from ..compute.devices import empty_cache
    gc.collect()
    empty_cache(accelerator.device)


def scan_data(cfg: TrainConfig, family=None):
    """The dataset's scan; a video family's (Family.frame_step) counts the folders' clips too."""
    from ..data import scan_dataset
    video = None
    if getattr(family, "frame_step", 0):
        from ..data.video_items import video_options
        video = video_options(cfg.dataset, family.frame_step, cfg.schedule.seed, family.audio_stream)
    # a model that generates and edits trains a paired folder's images without a control image on their captions
    captions_only = None if family is None else family.control_images == "optional"
    scan = scan_dataset(cfg, video=video, captions_only=captions_only)
    for warning in scan.warnings:
        LOG.warning(warning)
    clips = scan.summary.get("video") if video is not None else None
    if clips and (clips.get("with_audio") or family.audio_stream):  # the plan says what the audio tracks train
        clips["audio"] = family.clip_audio(clips["with_audio"], clips["clips"], clips.get("audio_trained", 0))
        LOG.info("audio: %s", clips["audio"])
    return scan


def build_dataset(cfg: TrainConfig, scan, counts, model, accelerator, run: Run):
    """The dataset with the plan's per-process counts (repeats differ from the folders' with
    hardware.keep_steps_per_epoch on N processes); latents and text-encoder outputs cached
    when asked (rank 0 first, the others reuse its cache)."""
    from ..data import TrainDataset, latent_cache_dir
    from ..data.pairs import check_reference_limit
    from ..diffusion.posterior import encode_posterior
    if model.family is not None:   # a VAE fine-tune trains no family's denoiser and reads no control images
        check_reference_limit(scan.items, scan.groups, model.family.max_control_images, model.family.label)
    dataset = TrainDataset(scan, cfg, counts=counts)
    if model.family is not None and model.family.audio_stream and scan.video is not None and scan.video.audio:
        dataset.audio = audio_encoding(model, accelerator)
    if cfg.dataset.cache_text_encoder_outputs:
        cache_text_outputs(cfg, dataset, model)
    if cfg.dataset.cache_latents:
        family = model.family
        names = family.pixel_condition_names if family is not None else ()

        @torch.no_grad()
        def encode(pixels: torch.Tensor):  # the posterior's mean and std: each step draws its own sample
            pixels = pixels.to(accelerator.device)
            mean, std = encode_posterior(model, pixels)
            if names:  # what a step would build from these pixels (Family.pixel_conditions), cached beside them
                conditions = {k: v.cpu() for k, v in family.pixel_conditions(model, pixels).items()}
                return mean.cpu(), None if std is None else std.cpu(), conditions
            return mean.cpu() if std is None else (mean.cpu(), std.cpu())

        from ..families.weights_identity import weights_identity
        # the weight files, not just their paths: a VAE overwritten in place invalidates the cache
        vae_id = (weights_identity(cfg.model.vae) if cfg.model.vae
                  else weights_identity(model.source, subfolder="vae"))
        with accelerator.main_process_first():
            dataset.cache_latents(encode, latent_cache_dir(cfg), progress=run.is_main, vae_id=vae_id,
                                  batch_size=cfg.dataset.latent_cache_batch_size, conditions=names)
    if cfg.dataset.cache_text_encoder_outputs and model.family is not None and model.family.text_reads_control:
        cache_pair_text(cfg, dataset, model)
    return dataset


def audio_encoding(model, accelerator):
    """The audio encoder of a family with an audio stream, for the clips that train their audio track."""
    from ..data.audio import AudioEncoding
    from ..families.weights_identity import weights_identity
    rate, channels = model.family.audio_format(model)

    @torch.no_grad()
    def encode(waveform: torch.Tensor) -> torch.Tensor:
        return model.family.encode_audio(model, waveform.to(accelerator.device)).cpu()
    return AudioEncoding(rate, channels, encode, weights_identity(model.source, subfolder="audio_vae"))


def cache_pair_text(cfg: TrainConfig, dataset, model) -> None:
    """An edit pair's text read with its control image, once per pair and orientation: possible when the
    latents are cached (the control image's crop is then fixed), as each step would encode it."""
    if cfg.network.train_text_encoder:
        return
    family = model.family

    def encode(caption: str, control: torch.Tensor) -> dict:
        batch = {"caption": [caption], "control_latents": control.unsqueeze(0)}
        text = family.encode_text(model, family.tokenize_batch(model, batch, cfg.dataset.max_token_length))
        return {name: tensor.to(getattr(torch, family.text_cache_dtype)).cpu() for name, tensor in text.items()}
    count = dataset.cache_pair_text(encode)
    if count:
        LOG.info("cached the text of %d edit pairs (each read with its control image, per orientation)", count)
    else:
        LOG.info("the edit pairs' text is encoded every step: their control images are cropped and flipped "
                 "per step (cache the latents to fix them), or captions change (shuffle/tag dropout)")


def cache_text_outputs(cfg: TrainConfig, dataset, model) -> None:
    """Encode each caption once; only valid while the text encoders are frozen."""
    if cfg.network.train_text_encoder:
        LOG.warning("dataset.cache_text_encoder_outputs is ignored: the text encoders are being trained")
        return
    family = model.family
    # an edit pair's caption is read with its control image's pixels (cropped and flipped per step): only the
    # caption-only images' text is cached; the pairs' batches (never mixed with them) encode theirs each step
    pairs_too = not family.text_reads_control
    if not pairs_too and all(item.control is not None for item in dataset.items):
        (LOG.info if cfg.dataset.cache_auto else LOG.warning)(  # cache_auto asked for it without knowing the family
            "dataset.cache_text_encoder_outputs is ignored: %s's text encoder reads each caption with its "
                    "control image", family.label)
        return

    def encode(captions: list[str]) -> dict:
        text = family.encode_text(model, family.tokenize(model, captions, cfg.dataset.max_token_length))
        dtype = getattr(torch, family.text_cache_dtype)
        return {name: tensor.to(dtype).cpu() for name, tensor in text.items()}

    key = f"{model.source}|{cfg.dataset.max_token_length}|{model.text_max_length}|{family.text_cache_dtype}"
    if model.clip_skip > 1:
        key += f"|clip_skip={model.clip_skip}"
    if dataset.cache_text(encode, key=key, batch_size=cfg.dataset.text_cache_batch_size, pairs=pairs_too):
        LOG.info("cached text-encoder outputs for the dataset's captions" if pairs_too else
                 "cached text-encoder outputs for the captions of the images without a control image (an edit "
                 "pair's text is read with its control image)")


def register_adapter_hooks(accelerator, trainable) -> None:
    """Checkpoints hold only the trainable weights (the adapters, or the trained modules of a full
    fine-tune), never the frozen base; the method's Trainable says what goes in which file."""
    from safetensors.torch import load_file, save_file

    def save_hook(models, weights, output_dir):
        if accelerator.is_local_main_process:  # every rank holds the same weights: one writer per node
            for name in trainable.modules:
                save_file(trainable.state_dict(name), str(Path(output_dir) / trainable.checkpoint_file(name)))
        weights.clear()

    def load_hook(models, input_dir):
        models.clear()
        for name in trainable.modules:
            trainable.load_state_dict(name, load_file(str(Path(input_dir) / trainable.checkpoint_file(name))))

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)
