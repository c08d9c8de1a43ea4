"""Flux.1 (dev and schnell) behind the family contract: a FluxTransformer2DModel trained with
rectified flow on 2×2-packed 16-channel latents, conditioned on T5 hidden states, the pooled
CLIP-L embedding, position ids and (dev) a distilled guidance value."""
from __future__ import annotations

import json
from pathlib import Path

from ..flow_common import FlowFamily, dynamic_shift, device_of as _device, unwrap as _unwrap

PIPELINES = ("FluxPipeline", "FluxImg2ImgPipeline", "FluxInpaintPipeline")
CLIP_MAX_LENGTH = 77


class FluxFamily(FlowFamily):
    """Flux.1, and (subclassed with other parameters) its variants that keep the double/single-block
    transformer on 2×2-packed latents: Chroma (families/chroma/)."""
    name = "flux"
    label = "Flux.1 (dev, schnell)"
    text_encoder_names = ("text_encoder", "text_encoder_2")
    trained_text_encoders = ("text_encoder",)  # CLIP-L; T5-XXL stays frozen
    full_single_file = "denoiser"
    # attention of the double blocks (image and text streams), the single blocks' attention and MLP input
    default_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                       "proj_mlp")
    text_encoder_file_options = ("clip_l", "t5")
    short_label = "Flux"
    component_files_loader = ".flux.components:load_flux_files"
    block_patterns = ((r"^transformer_blocks\.(\d+)\.", "double_{0:02d}"),
                      (r"^single_transformer_blocks\.(\d+)\.", "single_{0:02d}"), *FlowFamily.BASE_AND_END)
    base_model_version = "flux1"
    network_module = "networks.lora_flux"
    modelspec_implementation = "https://github.com/black-forest-labs/flux"
    modelspec_architecture = "flux-1"  # -dev or -schnell follows (architecture())
    # the diffusers classes and the bundled full-size config folder (assets/model_configs/<configs>/)
    pipelines: tuple[str, ...] = PIPELINES
    transformer_class = "FluxTransformer2DModel"
    configs = "flux"
    transformer_file_module = ".flux.single_file"

    # ---- detection and loading
    def detect_folder(self, folder: Path, index: dict) -> bool:
        return index.get("_class_name", "") in self.pipelines

    def detect_file(self, shapes, metadata) -> bool:
        return (any(k.endswith("double_blocks.0.img_attn.qkv.weight") for k in shapes)
                and not any(k.endswith(("single_stream_modulation.lin.weight",  # Flux.2
                                        "distilled_guidance_layer.in_proj.weight")) for k in shapes))  # Chroma

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny import build_tiny_flux
        return build_tiny_flux(out_dir, seed=seed, **options)

    def meta_denoiser(self):
        import diffusers
        import torch
        from ..sd.loader import ASSETS_CONFIGS
        config = json.loads((ASSETS_CONFIGS / self.configs / "transformer" / "config.json").read_text())
        with torch.device("meta"):
            return getattr(diffusers, self.transformer_class).from_config(config)

    # ---- text
    def t5_length(self, model) -> int:
        """model.t5_max_length, else the model's own (dev 512, schnell 256), within its tokenizer's limit."""
        own = 512 if model.denoiser.config.guidance_embeds else 256
        return min(model.text_max_length or own, model.tokenizers[1].model_max_length)

    def tokenize(self, model, captions, max_token_length):
        clip, t5 = model.tokenizers
        clip_ids = clip(list(captions), padding="max_length", max_length=CLIP_MAX_LENGTH, truncation=True,
                        return_tensors="pt").input_ids
        t5_ids = t5(list(captions), padding="max_length", max_length=self.t5_length(model), truncation=True,
                    return_tensors="pt").input_ids
        return [clip_ids, t5_ids]

    def encode_text(self, model, input_ids, encoders=None):
        clip, t5 = encoders or model.text_encoders
        pooled = clip(input_ids[0].to(_device(clip)), output_hidden_states=False).pooler_output
        hidden = t5(input_ids[1].to(_device(t5)), output_hidden_states=False)[0]
        return {"hidden": hidden, "pooled": pooled}

    # ---- objective and forward
    def objective(self, model):
        from ..objectives import FlowMatchObjective
        c = model.scheduler_config
        return FlowMatchObjective(shift=c.get("shift", 1.0), dynamic_shift=dynamic_shift(c))

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        import torch
        b, c, h, w = noisy.shape
        packed = noisy.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)
        img_ids = torch.zeros(h // 2, w // 2, 3)
        img_ids[..., 1] += torch.arange(h // 2)[:, None]
        img_ids[..., 2] += torch.arange(w // 2)[None, :]
        hidden = text["hidden"].to(noisy.device)
        txt_ids = torch.zeros(hidden.shape[1], 3)
        out = denoiser(hidden_states=packed.to(dtype), encoder_hidden_states=hidden.to(dtype),
                       timestep=(timesteps / 1000).to(dtype), img_ids=img_ids.reshape(-1, 3).to(noisy.device, dtype),
                       txt_ids=txt_ids.to(noisy.device, dtype), return_dict=False,
                       **self.conditioning(denoiser, text, packed.shape[1], noisy.device, dtype, cfg))[0]
        return out.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)

    def conditioning(self, denoiser, text, image_tokens: int, device, dtype, cfg=None) -> dict:
        """The transformer's conditioning besides the T5 states and positions: Flux's pooled CLIP-L
        embedding and (dev) the distilled guidance value. image_tokens: the packed latent's length."""
        import torch
        pooled = text["pooled"].to(device, dtype)
        guidance = None
        if getattr(_unwrap(denoiser).config, "guidance_embeds", False):
            value = cfg.model.guidance if cfg is not None else 1.0
            guidance = torch.full((pooled.shape[0],), float(value), device=device, dtype=torch.float32)
        return {"pooled_projections": pooled, "guidance": guidance}

    # ---- sampling and outputs
    def pipeline_class(self):
        import diffusers
        return getattr(diffusers, self.pipelines[0])

    def lora_file_state(self, model, adapter_states, alpha, layout="auto"):
        if self.lora_layout(layout) == "kohya":
            from .kohya_lora import to_kohya_flux
            return to_kohya_flux(adapter_states, alpha, model.denoiser)
        return super().lora_file_state(model, adapter_states, alpha, layout)

    def architecture(self, model) -> str:
        """dev has the guidance embedding, schnell has none (kohya's flux-1-dev / flux-1-schnell)."""
        dev = getattr(_unwrap(model.denoiser).config, "guidance_embeds", True)
        return f"{self.modelspec_architecture}-{'dev' if dev else 'schnell'}"

    def lora_metadata(self) -> dict[str, str]:
        return {"ss_base_model_version": self.base_model_version,
                "modelspec.architecture": f"{self.modelspec_architecture}/lora"}

    def save_full_model(self, model, folder, single_file, dtype=None, metadata=None) -> list[Path]:
        from .single_file import export_transformer
        out = []
        if folder is not None:
            self.build_pipeline(model, "default").save_pretrained(str(folder), safe_serialization=True)
            out.append(Path(folder))
        out.insert(0, export_transformer(model.denoiser, single_file, dtype=dtype, metadata=metadata))
        return out

    def read_lora_file(self, model, state, modules):
        from ..kohya_fused import is_kohya_layout
        if is_kohya_layout(state):
            from .kohya_lora import read_kohya_flux
            return read_kohya_flux(state, modules)
        return super().read_lora_file(model, state, modules)

    def load_denoiser_file(self, path, like):
        from .single_file import load_transformer_file
        return load_transformer_file(path, like)

    transformer_file_module = ".flux.single_file"

FLUX = FluxFamily()
