"""SD1, SD2 and SDXL behind the family contract: a UNet trained with DDPM noise (epsilon or
v-prediction), CLIP text encoders, a 4-channel KL VAE; SDXL adds a second text encoder, its
pooled embedding and size/crop conditioning."""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..base import Family, LoadedModel

# a UNet layer inside a down/up block; its kohya/A1111 block number is computed in block_of
_UNET_LAYER = re.compile(r"^(down|up)_blocks\.(\d+)\.(resnets|attentions|downsamplers|upsamplers)\.(\d+)\.")


class StableDiffusionFamily(Family):
    denoiser_name = "unet"
    default_targets = ("to_q", "to_k", "to_v", "to_out.0")
    keep_unquantized = ("time_embedding", "add_embedding")
    default_text_encoder_targets = ("q_proj", "k_proj", "v_proj", "out_proj")

    def __init__(self, name: str, label: str, *, text_encoder_names: tuple[str, ...], base_model_version: str,
                 modelspec_architecture: str, full_size_config: str):
        self.name, self.label = name, label
        self.text_encoder_names = text_encoder_names
        self.base_model_version, self.modelspec_architecture = base_model_version, modelspec_architecture
        self.full_size_config = full_size_config  # assets/model_configs/<name>

    # ---- detection and loading
    def detect_folder(self, folder: Path, index: dict) -> bool:
        from .loader import arch_of_folder
        try:
            unet_cfg = json.loads((folder / "unet" / "config.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return False
        return arch_of_folder(index, unet_cfg) == self.name

    def detect_file(self, shapes, metadata) -> bool:
        from .single_file import detect_arch_from_keys
        return detect_arch_from_keys(shapes) == self.name

    def load(self, src: Path, *, vae: str = "", prediction_type: str = "auto", tokenizer: str = "") -> LoadedModel:
        from .loader import load_model
        return load_model(str(src), arch=self.name, vae=vae, prediction_type=prediction_type, tokenizer=tokenizer)

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny import build_tiny_model
        return build_tiny_model(self.name, out_dir, seed=seed, **options)

    def meta_denoiser(self):
        import torch
        from diffusers import UNet2DConditionModel
        from .loader import ASSETS_CONFIGS
        config = UNet2DConditionModel.load_config(str(ASSETS_CONFIGS / self.full_size_config / "unet"))
        with torch.device("meta"):
            return UNet2DConditionModel.from_config(config)

    # ---- text
    def tokenize(self, model, captions, max_token_length):
        from .text import tokenize
        return tokenize(model, captions, max_token_length)

    def encode_text(self, model, input_ids, encoders=None):
        from .text import encode_text
        hidden, pooled = encode_text(model, input_ids, encoders)
        return {"hidden": hidden} if pooled is None else {"hidden": hidden, "pooled": pooled}

    def prompt_arguments(self, model, prompt, negative):
        if model.clip_skip <= 1:
            return super().prompt_arguments(model, prompt, negative)
        # diffusers' own clip_skip counts differently and reaches for transformers 4's `.text_model`
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        negatives = [negative or ""] * len(prompts) if not isinstance(negative, list) else list(negative)
        embed = lambda texts: self.encode_text(model, self.tokenize(model, texts, 75))["hidden"]  # noqa: E731
        return {"prompt_embeds": embed(prompts), "negative_prompt_embeds": embed(negatives)}

    def blocks(self, model) -> list:
        """The UNet's down blocks, its middle block, then its up blocks: the order its forward runs them."""
        unet = model.denoiser
        return [*unet.down_blocks, *([unet.mid_block] if unet.mid_block is not None else []), *unet.up_blocks]

    # ---- objective and forward
    def objective(self, model):
        from ..objectives import DDPMObjective
        return DDPMObjective(model.noise_scheduler, model.prediction_type)

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        hidden = text["hidden"].to(noisy.device)
        added = self.extra_conditioning(batch, text, noisy.device, hidden.dtype)
        return denoiser(noisy.to(dtype), timesteps, hidden.to(dtype), added_cond_kwargs=added).sample

    def extra_conditioning(self, batch: dict, text: dict, device, dtype) -> dict | None:
        """SDXL: the pooled text embedding and the size/crop time ids; SD1/SD2: none."""
        if self.name != "sdxl":
            return None
        import torch
        from .text import sdxl_add_time_ids
        time_ids = torch.stack([sdxl_add_time_ids(tuple(o), tuple(c), tuple(t)) for o, c, t in zip(
            batch["original_size"].tolist(), batch["crop_top_left"].tolist(), batch["target_size"].tolist())])
        return {"text_embeds": text["pooled"].to(device), "time_ids": time_ids.to(device, dtype)}

    # ---- blocks: kohya's and A1111's numbering of the original UNet's input/middle/output blocks
    block_patterns = ((r"^conv_in\b", "IN00"), (r"^mid_block\.resnets\.0\.", "M00"),
                      (r"^mid_block\.attentions\.0\.", "M01"), (r"^mid_block\.resnets\.1\.", "M02"),
                      (r"^(?:time_embedding|add_embedding|add_time_proj)\.", "BASE"),
                      (r"^(?:conv_norm_out|conv_out)\b", "END"))

    def block_of(self, model, module_path):
        """IN01-IN11: input_blocks.k of the original layout (k = 1 + 3i + j for layer j of down block i,
        its downsampler last); M00 (resnet), M01 (attention), M02 (resnet): the middle block; OUT00-OUT11:
        output_blocks.k (k = 3i + j, the upsampler with the last layer)."""
        found = _UNET_LAYER.match(module_path)
        if not found:
            return super().block_of(model, module_path)
        side, i, kind, j = found[1], int(found[2]), found[3], int(found[4])
        per_block = model.denoiser.config.layers_per_block
        per_block = per_block if isinstance(per_block, int) else per_block[i]
        if kind in ("downsamplers", "upsamplers"):
            j = per_block
        k = (per_block + 1) * i + j
        return f"IN{k + 1:02d}" if side == "down" else f"OUT{k:02d}"

    # ---- sampling and outputs
    def pipeline_class(self):
        from .loader import _pipeline_class
        return _pipeline_class(self.name)

    def build_pipeline(self, model, scheduler: str = "euler"):
        from .loader import build_pipeline
        return build_pipeline(model, scheduler)

    def lora_file_state(self, model, adapter_states, alpha, layout="auto"):
        from .lora_keys import to_kohya
        self.lora_layout(layout)
        return to_kohya(adapter_states, alpha, self.name, dict(model.denoiser.config))

    def read_lora_file(self, model, state, modules):
        if any(k.startswith(("lora_unet_", "lora_te")) for k in state):
            from .lora_keys import from_kohya
            return from_kohya(state, modules, self.name, dict(model.denoiser.config))
        return super().read_lora_file(model, state, modules)

    def diffusers_lora_targets(self, file_state, denoiser) -> set[str]:
        from diffusers.utils import convert_unet_state_dict_to_peft
        converted, _ = self.pipeline_class().lora_state_dict(dict(file_state), unet_config=denoiser.config)
        unet = {k[len("unet."):]: v for k, v in converted.items() if k.startswith("unet.")}
        return {k.rsplit(".lora_", 1)[0] for k in convert_unet_state_dict_to_peft(unet)}

    def lora_metadata(self) -> dict[str, str]:
        return {"ss_base_model_version": self.base_model_version, "ss_v2": str(self.name == "sd2"),
                "modelspec.architecture": f"{self.modelspec_architecture}/lora"}

    def save_full_model(self, model, folder, single_file, dtype=None, metadata=None) -> list[Path]:
        from .single_file_export import export_single_file
        out = []
        if folder is not None:
            from .transformers4_layout import write_transformers4_layout
            self.build_pipeline(model, scheduler="default").save_pretrained(str(folder), safe_serialization=True)
            write_transformers4_layout(folder)   # readable by transformers-4 tools too (kohya, old diffusers)
            out.append(Path(folder))
        out.insert(0, export_single_file(model, single_file, dtype=dtype, extra_metadata=metadata))
        return out


SD1 = StableDiffusionFamily("sd1", "Stable Diffusion 1.x", text_encoder_names=("text_encoder",),
                            base_model_version="sd_v1", modelspec_architecture="stable-diffusion-v1",
                            full_size_config="sd1")
SD2 = StableDiffusionFamily("sd2", "Stable Diffusion 2.x", text_encoder_names=("text_encoder",),
                            base_model_version="sd_v2", modelspec_architecture="stable-diffusion-v2-768-v",
                            full_size_config="sd2")
SDXL = StableDiffusionFamily("sdxl", "Stable Diffusion XL", text_encoder_names=("text_encoder", "text_encoder_2"),
                             base_model_version="sdxl_base_v1-0", modelspec_architecture="stable-diffusion-xl-v1-base",
                             full_size_config="sdxl")
SDXL.modelspec_implementation = "https://github.com/Stability-AI/generative-models"  # kohya's for SDXL LoRA
