"""Stable Diffusion 3 / 3.5 (Medium, Large) behind the family contract: an SD3Transformer2DModel
trained with rectified flow (shift 3) on 16-channel latents, conditioned on CLIP-L and CLIP-G
penultimate hidden states (padded to the T5 width) followed by T5 hidden states, and the two
CLIPs' pooled projections. T5 is optional: a model saved without it gets zeros in its place, as
the diffusers pipeline does."""
from __future__ import annotations

import json
from pathlib import Path

from ..flow_common import FlowFamily, device_of as _device, unwrap as _unwrap

CLIP_MAX_LENGTH = 77


def sd3_architecture(config) -> str:
    """modelspec.architecture of an SD3Transformer2DModel config, by the names kohya's sd-scripts write
    (`stable-diffusion-3-` + its model type) and the same rule: SD3 Medium has no q/k norm, SD3.5
    Medium has dual-attention (MMDiT-X) blocks, SD3.5 Large (and Large Turbo) has neither."""
    get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
    if not get("qk_norm"):
        return "stable-diffusion-3-medium"
    return "stable-diffusion-3-5-medium" if get("dual_attention_layers") else "stable-diffusion-3-5-large"


class SD3Family(FlowFamily):
    name = "sd3"
    label = "Stable Diffusion 3 / 3.5"
    text_encoder_names = ("text_encoder", "text_encoder_2", "text_encoder_3")
    trained_text_encoders = ("text_encoder", "text_encoder_2")  # the CLIPs; T5 stays frozen
    # full fine-tunes: also the transformer in the original layout (with the autoencoder, as the SD3.5 release files)
    full_single_file = "denoiser"
    text_encoder_file_options = ("clip_l", "clip_g", "t5")
    short_label = "SD3"
    component_files_loader = ".sd3.components:load_sd3_files"
    # the joint blocks' attention on both streams, and their MLPs' projections
    default_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")
    block_patterns = ((r"^transformer_blocks\.(\d+)\.", "joint_{0:02d}"), *FlowFamily.BASE_AND_END)
    base_model_version = "sd3"   # the loaded variant's: medium, 5-medium or 5-large (base_model_version_of)
    network_module = "networks.lora_sd3"
    transformer_file_module = ".sd3.single_file"
    modelspec_architecture = "stable-diffusion-3"  # the variant's name follows (architecture())

    def architecture(self, model) -> str:
        return sd3_architecture(_unwrap(model.denoiser).config)

    def base_model_version_of(self, model) -> str:
        """kohya's sd3 model type: medium (SD3 Medium), 5-medium, 5-large."""
        return self.architecture(model).removeprefix("stable-diffusion-3-")

    # ---- detection and loading
    def detect_folder(self, folder: Path, index: dict) -> bool:
        return index.get("_class_name", "").startswith("StableDiffusion3")

    def detect_file(self, shapes, metadata) -> bool:
        return any(k.endswith("joint_blocks.0.x_block.attn.qkv.weight") for k in shapes)

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny import build_tiny_sd3
        return build_tiny_sd3(out_dir, seed=seed)

    def meta_denoiser(self):
        import torch
        from diffusers import SD3Transformer2DModel
        from ..sd.loader import ASSETS_CONFIGS
        config = json.loads((ASSETS_CONFIGS / "sd3" / "transformer" / "config.json").read_text())
        with torch.device("meta"):
            return SD3Transformer2DModel.from_config(config)

    # ---- text
    def t5_length(self, model) -> int:
        limit = model.tokenizers[2].model_max_length if len(model.tokenizers) > 2 else 256
        return min(model.text_max_length or 256, limit)

    def tokenize(self, model, captions, max_token_length):
        ids = [tok(list(captions), padding="max_length", max_length=CLIP_MAX_LENGTH, truncation=True,
                   return_tensors="pt").input_ids for tok in model.tokenizers[:2]]
        if len(model.tokenizers) > 2:
            ids.append(model.tokenizers[2](list(captions), padding="max_length", max_length=self.t5_length(model),
                                           truncation=True, return_tensors="pt").input_ids)
        return ids

    def encode_text(self, model, input_ids, encoders=None):
        import torch
        encoders = encoders or model.text_encoders
        hidden, pooled = [], []
        for encoder, ids in zip(encoders[:2], input_ids[:2]):
            out = encoder(ids.to(_device(encoder)), output_hidden_states=True)
            pooled.append(out[0])
            hidden.append(out.hidden_states[-2])
        clip = torch.cat(hidden, dim=-1)
        width = _unwrap(model.denoiser).config.joint_attention_dim
        if len(encoders) > 2:
            t5 = encoders[2](input_ids[2].to(_device(encoders[2])))[0]
        else:  # no T5: zeros in its place, as the pipeline does
            t5 = torch.zeros(clip.shape[0], self.t5_length(model), width, device=clip.device, dtype=clip.dtype)
        clip = torch.nn.functional.pad(clip, (0, width - clip.shape[-1]))
        return {"hidden": torch.cat([clip, t5.to(clip.dtype)], dim=-2), "pooled": torch.cat(pooled, dim=-1)}

    # ---- objective and forward
    def objective(self, model):
        from ..objectives import FlowMatchObjective
        return FlowMatchObjective(shift=model.scheduler_config.get("shift", 3.0))

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        return denoiser(hidden_states=noisy.to(dtype), timestep=timesteps.to(dtype),
                        encoder_hidden_states=text["hidden"].to(noisy.device, dtype),
                        pooled_projections=text["pooled"].to(noisy.device, dtype), return_dict=False)[0]

    # ---- sampling and outputs
    def pipeline_class(self):
        from diffusers import StableDiffusion3Pipeline
        return StableDiffusion3Pipeline

    def export_single_file(self, model, single_file, dtype, metadata) -> Path:
        from .single_file import export_checkpoint  # the transformer with the autoencoder, as SD3.5's files
        return export_checkpoint(model.denoiser, model.vae, single_file, dtype=dtype, metadata=metadata)

    def save_text_encoder_files(self, model, single_file, dtype=None) -> list[Path]:
        """`<name>_clip_l.safetensors`, `<name>_clip_g.safetensors` beside the single file, in ComfyUI's
        layout with their projections (model.clip_l / model.clip_g take them; T5 is never trained)."""
        from .components import save_clip_file
        single_file = Path(single_file)
        options = dict(zip(self.text_encoder_names, self.text_encoder_file_options))
        return [save_clip_file(encoder, single_file.with_name(f"{single_file.stem}_{options[name]}.safetensors"),
                               dtype=dtype) for name, encoder in model.trained_text_encoders()]

    def lora_file_state(self, model, adapter_states, alpha, layout="auto"):
        if self.lora_layout(layout) == "kohya":
            from .kohya_lora import to_kohya_sd3
            return to_kohya_sd3(adapter_states, alpha, _unwrap(model.denoiser))
        return super().lora_file_state(model, adapter_states, alpha, layout)

    def read_lora_file(self, model, state, modules):
        from ..kohya_fused import is_kohya_layout
        if is_kohya_layout(state):
            from .kohya_lora import read_kohya_sd3
            return read_kohya_sd3(state, modules)
        return super().read_lora_file(model, state, modules)



SD3 = SD3Family()
