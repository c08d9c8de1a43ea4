"""Training methods: what is trainable, the loss it is trained on, and how it is saved.

Two axes (docs/methods.md): network.type says what is trained (lora | loha | lokr adapters, with
network.dora / network.conv_rank for LoRA's DoRA and LoCon-style conv adapters, full, or vae), and
class images (dataset.class_path / dataset.num_class_images) turn on DreamBooth prior preservation.
The loop (training/loop.py) calls the functions here and never asks which method runs.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..config import TrainConfig

if TYPE_CHECKING:  # the package stays torch-free: `launch` and the config checks import methods.checks
    from .base import Trainable

LOG = logging.getLogger("trainer")


def __getattr__(name: str):
    """`methods.Trainable` on first use (it needs torch, which the launcher process never imports)."""
    if name == "Trainable":
        from .base import Trainable
        return Trainable
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Trainable", "adapter_switch", "describe_method", "load_method_model", "method_loss",
           "method_run_config", "method_validator", "save_outputs", "setup_method"]


def method_run_config(cfg: TrainConfig) -> TrainConfig:
    """The config the run trains with (a VAE run: vae.precision as mixed precision, no caches)."""
    if cfg.network.type == "vae":
        from .vae import check_vae_config, vae_run_config
        check_vae_config(cfg)
        return vae_run_config(cfg)
    return cfg


def load_method_model(cfg: TrainConfig):
    """The base model (LoadedModel) in fp32; a VAE run loads the autoencoder alone."""
    if cfg.network.type == "vae":
        from .vae import load_vae_model
        return load_vae_model(cfg)
    from ..families import load_configured
    # the frozen parts' storage, as training/setup.py's place_denoiser and place_encoders will quantize them
    model = load_configured(cfg.model, frozen_quantize=cfg.model.quantize if cfg.network.type != "full" else "none",
                            frozen_quantize_text_encoders=cfg.model.quantize_text_encoders)
    model.text_max_length = cfg.model.t5_max_length
    if cfg.model.clip_skip > 1:
        from ..config.rules import clip_skip_refusal
        from ..errors import ConfigError
        from ..families.registry import entry
        if not entry(model.arch).clip_skip:  # model.arch = auto: known now
            raise ConfigError(f"model.clip_skip: {clip_skip_refusal(model.arch)}")
        model.clip_skip = cfg.model.clip_skip
    if cfg.network.train_text_encoder:
        from ..families.registry import entry
        if not entry(model.arch).text_encoder_training:  # model.arch = auto: known now
            from ..config.rules import text_encoder_refusal
            from ..errors import ConfigError
            raise ConfigError(f"network.train_text_encoder: {text_encoder_refusal(model.arch)}")
    if cfg.model.arch == "auto":  # the config rules could not know the family's control images yet
        from ..config.control_rules import control_problems
        for problem in control_problems(cfg, model.family.control_images, model.family.name):
            raise problem.error()
    return model


def method_loss(cfg: TrainConfig, model, modules: dict, weight_dtype, accelerator):
    """The loss of one batch, `loss(batch, epoch=, parts=)`, over the prepared (DDP-wrapped) modules:
    the family's diffusion objective, or a VAE run's reconstruction."""
    device = accelerator.device
    if cfg.network.type == "vae":
        from .vae import vae_loss
        return lambda batch, epoch, parts=None: vae_loss(modules["vae"], batch, cfg=cfg, epoch=epoch, device=device)
    from ..diffusion.loss import diffusion_loss
    family = model.family
    denoiser = modules.get(family.denoiser_name, model.denoiser)
    encoders = [modules.get(name, te) for name, te in zip(family.text_encoder_names, model.text_encoders)]
    return lambda batch, epoch, parts=None: diffusion_loss(
        model, denoiser, batch, cfg=cfg, epoch=epoch, device=device, weight_dtype=weight_dtype,
        text_encoders=encoders, parts=parts)


def method_validator(cfg: TrainConfig, model, accelerator, run, weight_dtype, modules: dict):
    """validation.*: the held-out loss of the method's own objective (a no-op when off)."""
    if cfg.network.type == "vae":
        from .vae import ReconstructionValidator
        return ReconstructionValidator(cfg, accelerator, run, modules["vae"])
    from ..diffusion.validation import make_validator
    family = model.family
    encoders = [modules.get(name, te) for name, te in zip(family.text_encoder_names, model.text_encoders)]
    return make_validator(cfg, model, accelerator, run, weight_dtype,
                          modules.get(family.denoiser_name, model.denoiser), encoders)


def adapter_switch(trainable: Trainable):
    """(adapters_disabled, adapter_delta_norm) for an adapter run, None for full/VAE runs: what the
    adapter-effect check (diffusion/adapter_effect.py) compares with and measures."""
    if trainable.kind != "adapter":
        return None
    from .adapter_probe import adapter_delta_norm, adapters_disabled
    return adapters_disabled, adapter_delta_norm


def describe_method(cfg: TrainConfig, class_samples: int = 0) -> str:
    """The method in the words kohya users know: LoRA, DreamBooth LoRA, DreamBooth, fine-tune."""
    from .variants import variant_name
    what = variant_name(cfg)
    te = " and text encoder(s)" if cfg.network.train_text_encoder else ""
    if cfg.network.type == "full":
        base = "DreamBooth (full UNet" + te + ")" if class_samples else "fine-tune (full UNet" + te + ")"
    else:
        base = ("DreamBooth " if class_samples else "") + what + (" on UNet" + te if te else "")
    prior = f", prior preservation with {class_samples} class samples/epoch, weight " \
            f"{cfg.dataset.prior_loss_weight}" if class_samples else ""
    return base + prior


def setup_method(model, cfg: TrainConfig, class_samples: int = 0) -> Trainable:
    """Freeze what is not trained, make what is trainable fp32, log the method (and, for adapter
    variants without a kohya/webui format, say so in the run log)."""
    from .checks import check_method_config
    from .variants import format_note
    check_method_config(cfg)
    if cfg.network.type == "vae":
        from .vae import setup_vae
        return setup_vae(model.vae, cfg)
    if cfg.network.type == "full":
        from .full import setup_full
        trainable = setup_full(model, cfg)
    else:
        from .lora import alpha_for_module, setup_lora
        layout = model.family.lora_layout(cfg.output.lora_format)  # refused before training, naming the key
        trainable = setup_lora(model, cfg)
        if cfg.network.network_weights:  # into the fp32 adapters; a resumed checkpoint loads later and wins
            from .network_weights import load_network_weights
            load_network_weights(model, trainable.modules, cfg, alpha_for_module(cfg))
    from ..compute.quantize import ddp_skip_frozen
    ddp_skip_frozen(trainable.modules)  # a quantized frozen base never goes through DDP's broadcast
    count = sum(p.numel() for p in trainable.parameters())
    LOG.info("method: %s; %s trainable parameters", describe_method(cfg, class_samples), f"{count:,}")
    if cfg.network.type != "full":
        LOG.info(format_note(cfg, layout))
    return trainable


def save_outputs(cfg: TrainConfig, accelerator, run, model, trainable: Trainable, state, scan, ema=None,
                 file_name: str = "") -> list[str]:
    """Write the run's outputs on the main process (all processes call). file_name: an intermediate
    export (see checkpointer.py) that leaves the model as it is. With ema.use_for_output, the EMA
    weights are what is saved."""
    import contextlib
    from .kohya_format import kohya_metadata, tag_frequency
    accelerator.wait_for_everyone()
    outputs: list[str] = []
    if accelerator.is_main_process and trainable.kind == "vae":
        if not file_name:  # a VAE run has no intermediate exports
            from .vae import save_vae_outputs
            vae = accelerator.unwrap_model(trainable.modules["vae"]).vae
            outputs = [str(p) for p in save_vae_outputs(cfg, run.dir, vae, {"ss_steps": str(state.global_step)})]
    elif accelerator.is_main_process:
        use_ema = ema is not None and ema.active and cfg.ema.use_for_output
        if use_ema and not file_name:
            ema.copy_to_params()  # training is over: the EMA weights become the model's
            LOG.info("output uses the EMA weights (ema.use_for_output)")
        meta = kohya_metadata(cfg, model.family, steps=state.global_step, epochs=state.epoch,
                              num_images=len(scan.items), tag_frequency=tag_frequency(scan),
                              started_at=run.started, model=model)
        with ema.applied() if use_ema and file_name else contextlib.nullcontext():
            if trainable.kind == "full":
                from .full import save_full_outputs
                meta = {k: v for k, v in meta.items() if not k.startswith(("ss_network", "modelspec"))}
                meta["modelspec.architecture"] = model.family.architecture(model)  # the base model's, no suffix
                paths = save_full_outputs(cfg, run.dir, model, trainable, meta, file_name=file_name)
            else:
                from .variants import save_adapter_output
                path = run.dir / (file_name or f"{cfg.output.name}.safetensors")
                from .kohya_format import lora_output_paths
                paths = lora_output_paths(save_adapter_output(cfg, path, model, trainable, meta), model)
        outputs = [str(p) for p in paths]
        for p in outputs:
            LOG.info("saved %s", p)
    if accelerator.is_main_process:
        from ..run.file_modes import respect_umask
        for p in outputs:   # safetensors writes 0600: readable by a webui running as another user
            respect_umask(p)
    accelerator.wait_for_everyone()
    return outputs
