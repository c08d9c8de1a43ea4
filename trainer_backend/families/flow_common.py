"""What the rectified-flow transformer families (SD3, Flux, Flux.2, Z-Image, Qwen-Image) share:
loading a diffusers pipeline folder, LoRA files in diffusers' layout and their metadata, full
fine-tunes written as the transformer's single file plus a diffusers folder, the T5-cache dtype
and the tiny models' 16-channel VAE."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

from ..errors import ConfigError
from .base import Family, LoadedModel
from .component_files import with_article


class FlowFamily(Family):
    """A Family whose model is one diffusers pipeline folder with a `transformer` and up to three
    text encoders (`text_encoder`, `text_encoder_2`, `text_encoder_3`; absent ones are skipped), or
    the separate component files its component_files_loader reads."""
    denoiser_name = "transformer"
    text_cache_dtype = "float16"  # T5 hidden states: 4096 wide, up to 512 tokens per caption
    keep_unquantized = ("time_text_embed", "context_embedder", "x_embedder", "norm_out", "proj_out")
    default_text_encoder_targets = ("q_proj", "k_proj", "v_proj", "out_proj")
    # the embeddings before the blocks, the output layers after them
    BASE_AND_END = ((r"^(?:pos_embed|x_embedder|context_embedder|time_text_embed)\.", "BASE"),
                    (r"^(?:norm_out|proj_out)\b", "END"))
    # the module that writes and reads the family's transformer single file (its export_transformer and
    # load_transformer_file), relative to this package, e.g. ".flux.single_file"
    transformer_file_module = ""
    # appended to modelspec.architecture in LoRA files ("flux-1-dev/lora", as SAI's modelspec names them)
    lora_architecture_suffix = "/lora"
    # the family's name in messages ("Flux" in "applies to a Flux single file"); empty: its label
    short_label = ""
    # "module:function" (module relative to this package) loading the separate files ComfyUI users keep:
    # function(family, src, *, vae, tokenizer, files) -> LoadedModel; empty: diffusers folders only
    component_files_loader = ""

    @property
    def short_name(self) -> str:
        return self.short_label or self.label

    def load(self, src: Path, *, vae: str = "", prediction_type: str = "auto", tokenizer: str = "",
             text_encoder_files: dict[str, str] | None = None) -> LoadedModel:
        if src.is_dir():
            if text_encoder_files:
                encoders = "text encoders" if len(self.text_encoder_names) > 1 else "text encoder"
                raise ConfigError(f"model.{next(iter(text_encoder_files))}: applies to {with_article(self.short_name)} "
                                  f"single file; {src} is a diffusers folder with its own {encoders}")
            return self.load_folder(src, vae=vae, prediction_type=prediction_type)
        if not self.component_files_loader:
            raise ConfigError(f"model.path: {src} is a {self.label} single file; this family loads from a diffusers "
                              "folder (single files are not supported yet)")
        if prediction_type not in ("auto", "flow"):
            raise ConfigError(f"model.prediction_type: {self.label} predicts the flow; use \"auto\"")
        module, function = self.component_files_loader.split(":")
        load_files = getattr(importlib.import_module(module, __package__), function)
        return load_files(self, src, vae=vae, tokenizer=tokenizer, files=text_encoder_files or {})

    def load_folder(self, src: Path, *, vae: str = "", prediction_type: str = "auto") -> LoadedModel:
        import torch
        from .sd.loader import _first_line, _load_vae
        if prediction_type not in ("auto", "flow"):
            raise ConfigError(f"model.prediction_type: {self.label} predicts the flow (noise − image); "
                              f"{prediction_type!r} does not apply (use \"auto\")")
        try:
            pipeline, components = self.folder_pipeline(src)
            pipe = pipeline.from_pretrained(str(src), local_files_only=True, dtype=torch.float32, **components)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            raise ConfigError(f"model.path: cannot load {src} as a {self.label} model ({_first_line(e)})") from None
        if vae:
            pipe.vae = _load_vae(vae, pipe.vae)
        slots = [(getattr(pipe, name, None), getattr(pipe, name.replace("text_encoder", "tokenizer"), None))
                 for name in self.text_encoder_names]
        slots = [(e, t) for e, t in slots if e is not None]
        return LoadedModel(family=self, denoiser=pipe.transformer, vae=pipe.vae,
                           text_encoders=[e for e, _ in slots], tokenizers=[t for _, t in slots],
                           noise_scheduler=pipe.scheduler, prediction_type="flow", source=str(src),
                           vae_scale_factor=2 ** (len(pipe.vae.config.block_out_channels) - 1),
                           scheduler_config=dict(pipe.scheduler.config))

    def build_pipeline(self, model, scheduler: str = "euler"):
        from diffusers import FlowMatchEulerDiscreteScheduler
        if scheduler not in ("default", "euler"):
            raise ConfigError(f"samples.scheduler: {scheduler!r} does not apply to {self.short_name} "
                              "(use euler or default)")
        pipe = self.model_pipeline_class(model)(
            scheduler=FlowMatchEulerDiscreteScheduler.from_config(model.scheduler_config), vae=model.vae,
            transformer=model.denoiser, **self.pipeline_parts(model))
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def folder_pipeline(self, src: Path) -> tuple[type, dict]:
        """The pipeline class that loads the folder `src`, and components loaded here and handed to its
        from_pretrained (a family whose folders come in several kinds overrides: Flux.2 Klein and dev)."""
        return self.pipeline_class(), {}

    def pipeline_parts(self, model) -> dict:
        """The pipeline's components besides scheduler, vae and transformer: its text encoders and
        tokenizers by slot name (text_encoder, tokenizer, text_encoder_2, ...; a slot the model lacks,
        SD3 without T5, is None)."""
        parts = {}
        for i, name in enumerate(self.text_encoder_names):
            parts[name] = model.text_encoders[i] if i < len(model.text_encoders) else None
            tokenizer = model.tokenizers[i] if i < len(model.tokenizers) else None
            parts[name.replace("text_encoder", "tokenizer")] = tokenizer
        return parts

    def lora_file_state(self, model, adapter_states, alpha, layout="auto"):
        self.lora_layout(layout)  # diffusers unless the family overrides this (Flux: kohya too)
        return to_diffusers_lora(adapter_states, alpha, transformers4_prefixes(model, adapter_states))

    def diffusers_lora_targets(self, file_state, denoiser) -> set[str]:
        converted = self.pipeline_class().lora_state_dict(dict(file_state))
        state = converted[0] if isinstance(converted, tuple) else converted
        prefix = self.denoiser_name + "."
        return {k[len(prefix):].rsplit(".lora_", 1)[0] for k in state if k.startswith(prefix)}

    def lora_metadata(self) -> dict[str, str]:
        return {"ss_base_model_version": self.base_model_version,
                "modelspec.architecture": self.modelspec_architecture + self.lora_architecture_suffix}

    def transformer_file(self):
        """The family's transformer-file module (transformer_file_module), imported on first use."""
        return importlib.import_module(self.transformer_file_module, __package__)

    def save_full_model(self, model, folder, single_file, dtype=None, metadata=None) -> list[Path]:
        out = [self.export_single_file(model, single_file, dtype, metadata)]
        if folder is not None:
            self.save_pipeline_folder(model, Path(folder))
            out.append(Path(folder))
        return out

    def export_single_file(self, model, single_file, dtype, metadata) -> Path:
        """The full fine-tune's single file: the transformer alone, in the family's file layout."""
        return self.transformer_file().export_transformer(model.denoiser, single_file, dtype=dtype, metadata=metadata)

    def save_pipeline_folder(self, model, folder: Path) -> None:
        self.build_pipeline(model, "default").save_pretrained(str(folder), safe_serialization=True)

    def load_denoiser_file(self, path, like):
        return self.transformer_file().load_transformer_file(path, like)

    def pipeline_call_options(self, model) -> dict:
        return {"max_sequence_length": self.t5_length(model)}

    def t5_length(self, model) -> int:
        raise NotImplementedError


def dynamic_shift(scheduler_config: dict, max_seq_len: int = 4096, max_shift: float = 1.15) -> dict | None:
    """The resolution-dependent shift of a scheduler config that uses one (Flux's defaults; Qwen-Image's
    are 8192 tokens and 0.9), as FlowMatchObjective's dynamic_shift; None when it does not."""
    c = scheduler_config
    if not c.get("use_dynamic_shifting"):
        return None
    return dict(base_seq_len=c.get("base_image_seq_len", 256), max_seq_len=c.get("max_image_seq_len", max_seq_len),
                base_shift=c.get("base_shift", 0.5), max_shift=c.get("max_shift", max_shift))


def tiny_vae_16ch(scaling_factor: float, shift_factor: float):
    """The tiny models' 16-channel KL VAE (two levels: a 32 px image is a 16×16 latent)."""
    from diffusers import AutoencoderKL
    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16, layers_per_block=1,
                         block_out_channels=(16, 32), norm_num_groups=8, sample_size=32,
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         scaling_factor=scaling_factor, shift_factor=shift_factor, use_quant_conv=False,
                         use_post_quant_conv=False)


def device_of(module):
    return next(module.parameters()).device


def unwrap(module):
    return getattr(module, "module", module)  # DDP


# LoRA files in diffusers' layout: `transformer.<module>.lora_A.weight` / `lora_B.weight` (and
# `text_encoder.…`), which diffusers' `load_lora_weights` reads directly and ComfyUI's LoRA loader
# maps. The layout has no alpha keys (its loaders take alpha = rank), so alpha/rank is folded into
# lora_B: the file applies exactly the trained update with no scale to get wrong downstream.
def transformers4_prefixes(model, adapter_states: dict) -> dict[str, str]:
    """Component -> the prefix that gives its keys transformers 4's names. transformers 5 flattened
    CLIPTextModel (no `text_model.`); ComfyUI maps only `text_encoder.text_model.…` (it dropped all 96
    of Flux's CLIP-L keys), diffusers with transformers 4 fails without it, and diffusers with
    transformers 5 reads both. CLIPTextModelWithProjection (SD3's) still has `text_model.`."""
    if set(adapter_states) <= {getattr(model.family, "denoiser_name", "transformer")}:
        return {}
    parts = {name: getattr(m, "module", m) for name, m in model.components().items()}  # DDP-wrapped too
    return {name: "text_model." for name in adapter_states
            if getattr(getattr(parts.get(name), "config", None), "model_type", "") == "clip_text_model"
            and not hasattr(parts[name], "text_model")}


def to_diffusers_lora(state_dicts: dict[str, dict], alpha: float | Callable[[str, str], float],
                      prefixes: dict[str, str] | None = None) -> dict:
    """peft adapter weights per component -> one diffusers-layout LoRA state dict (`prefixes`: a
    component's key prefix, transformers4_prefixes)."""
    out: dict = {}
    for component, sd in state_dicts.items():
        prefix = (prefixes or {}).get(component, "")
        for key, tensor in sd.items():
            if not key.endswith(("lora_A.weight", "lora_B.weight")):
                raise ValueError(f"unexpected adapter key {key!r}: not a LoRA weight")
            module = key.rsplit(".lora_", 1)[0]
            if key.endswith("lora_B.weight"):
                rank = sd[f"{module}.lora_A.weight"].shape[0]
                value = alpha(component, module) if callable(alpha) else alpha
                tensor = tensor * (float(value) / rank)
            out[f"{component}.{prefix}{key}"] = tensor.contiguous()
    return out
