"""Qwen-Image 2.1 behind the family contract: one model for generation and editing. A single-stream,
block-causal QwenImage21Transformer2DModel trained with rectified flow on UNPACKED latents (one token
per latent cell) of its RGBA autoencoder (AutoencoderKLQwenImage21: 16× spatial, 64 channels,
normalised per channel by latents_mean/std), conditioned on Qwen3-VL hidden states (text.py).

Editing is the same model: a control image (dataset.control_path, optional) is read by the
vision-language encoder as vision tokens before the instruction, and its latents fill exactly those
positions of the joint sequence (the transformer's img_mask), ahead of the target image's tokens;
img_shapes lists the control image first and the target last, as QwenImage21Pipeline calls it.
The resolution-dependent shift counts the unpacked tokens (the pipeline's latents.shape[1])."""
from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ..flow_common import FlowFamily, dynamic_shift, device_of as _device
from ..objectives import FlowMatchObjective, resolution_shift
from ..qwen_image.family import latent_stats
from . import text as qtext

PIPELINES = ("QwenImage21Pipeline",)
DEFAULT_TEXT_LENGTH = 512  # caption tokens kept per caption (model.t5_max_length)


def flatten(latents):
    """[B, C, h, w] -> [B, h·w, C]: the pipeline's _pack_latents (2.1 consumes latents unpatched)."""
    return latents.flatten(2).transpose(1, 2)


class UnpackedFlowObjective(FlowMatchObjective):
    """The pipeline's calculate_shift(mu) over latents.shape[1]: every latent cell is a token."""

    def _shift(self, latent_shape, loss) -> float:
        if loss.flow_shift > 0 or self.dynamic_shift is None:
            return super()._shift(latent_shape, loss)
        return resolution_shift(latent_shape[-2] * latent_shape[-1], **self.dynamic_shift)


class QwenImage21Family(FlowFamily):
    name = "qwen_image21"
    label = "Qwen-Image 2.1"
    text_encoder_names = ("text_encoder",)
    trained_text_encoders = ()  # Qwen3-VL stays frozen: diffusers' Qwen-Image LoRA loader reads the transformer
    full_single_file = "denoiser"
    text_cache_dtype = "bfloat16"
    # the single stream's attention and SwiGLU MLP in every block (the shared modulation stays frozen)
    default_targets = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "img_mlp.proj", "img_mlp.gate_layer",
                       "img_mlp.out")
    keep_unquantized = ("time_text_embed", "img_in", "txt_in", "modulation", "norm_out", "proj_out")
    block_patterns = ((r"^transformer_blocks\.(\d+)\.", "block_{0:02d}"),
                      (r"^(?:img_in|txt_in|time_text_embed|modulation)\b", "BASE"), (r"^(?:norm_out|proj_out)\b", "END"))
    base_model_version = "qwen_image_21"
    network_module = "networks.lora_qwen_image"
    modelspec_implementation = "https://github.com/QwenLM/Qwen-Image"
    modelspec_architecture = "qwen-image-2.1"
    transformer_file_module = ".qwen_image21.single_file"
    text_encoder_file_options = ("text_encoder",)
    component_files_loader = ".qwen_image21.components:load_qwen_image21_files"  # ComfyUI's separate files
    control_images = "optional"
    control_image_argument = "image"
    # the VL encoder reads an edit pair's control image with its caption: text is encoded per batch
    text_reads_control = True

    def detect_folder(self, folder: Path, index: dict) -> bool:
        return index.get("_class_name", "") in PIPELINES

    def detect_file(self, shapes, metadata) -> bool:
        from .single_file import is_transformer_file
        return is_transformer_file(shapes)

    def load_folder(self, src: Path, *, vae: str = "", prediction_type: str = "auto"):
        import torch
        from .components import load_vae  # a VAE folder, or a file in ComfyUI's or diffusers' names
        from ..sd.loader import _first_line
        if prediction_type not in ("auto", "flow"):
            raise ConfigError(f"model.prediction_type: {self.label} predicts the flow (noise − image); "
                              f"{prediction_type!r} does not apply (use \"auto\")")
        try:
            pipe = self.pipeline_class().from_pretrained(str(src), local_files_only=True, dtype=torch.float32,
                                                         processor=qtext.load_processor(src / "processor"))
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError) as e:
            raise ConfigError(f"model.path: cannot load {src} as a {self.label} model ({_first_line(e)})") from None
        if vae:
            pipe.vae = load_vae(vae)
        return self.loaded(src, pipe.transformer, pipe.vae, pipe.text_encoder, pipe.processor,
                           dict(pipe.scheduler.config))

    def loaded(self, src, transformer, vae, text_encoder, processor, scheduler_config: dict):
        from diffusers import FlowMatchEulerDiscreteScheduler
        from ..base import LoadedModel
        return LoadedModel(family=self, denoiser=transformer, vae=vae, text_encoders=[text_encoder],
                           tokenizers=[processor], noise_scheduler=FlowMatchEulerDiscreteScheduler.from_config(
                               scheduler_config), prediction_type="flow", source=str(src), vae_scale_factor=16,
                           scheduler_config=scheduler_config)

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny import build_tiny_qwen_image21
        return build_tiny_qwen_image21(out_dir, seed=seed)

    def meta_denoiser(self):
        import torch
        from diffusers import QwenImage21Transformer2DModel
        from .single_file import bundled
        with torch.device("meta"):
            return QwenImage21Transformer2DModel.from_config(bundled("transformer/config.json"))

    # ---- text
    def t5_length(self, model) -> int:
        return min(model.text_max_length or DEFAULT_TEXT_LENGTH, 1024)

    def tokenize(self, model, captions, max_token_length, controls=None):
        images = None if controls is None else [qtext_image(c) for c in _to_pil(controls)]
        return qtext.tokenize(model.tokenizers[0], list(captions), images)

    def probe_tokens(self, model, captions):
        """The captions alone (the control image's vision tokens need its pixel values, which the meta
        device does not have): the memory planner's text pass leaves an edit pair's vision tokens out."""
        return self.tokenize(model, captions, 0)

    def tokenize_batch(self, model, batch, max_token_length):
        import torch
        controls = batch.get("control_pixel_values")
        if controls is None and batch.get("control_latents") is not None:  # cached latents: back to pixels
            with torch.no_grad():
                controls = self.decode_latents(model, batch["control_latents"].to(_device(model.vae)))
        return self.tokenize(model, list(batch["caption"]), max_token_length, controls=controls)

    def encode_text(self, model, input_ids, encoders=None):
        encoder = (encoders or model.text_encoders)[0]
        inputs = [t.to(_device(encoder)) for t in input_ids]
        length = None if len(inputs) > 2 else self.t5_length(model)
        return qtext.encode(encoder, model.tokenizers[0], inputs, length)

    # ---- latents (the autoencoder reads RGBA: an opaque alpha, as the pipeline converts images)
    def latent_shape(self, model, height, width):
        return (model.vae.config.z_dim, height // 16, width // 16)

    def encode_latents(self, model, pixels, eps):
        import torch
        vae = model.vae
        rgba = torch.cat([pixels, torch.ones_like(pixels[:, :1])], dim=1)
        dist = vae.encode(rgba.to(vae.dtype).unsqueeze(2)).latent_dist
        latents = dist.mean if eps is None else dist.mean + dist.std * eps.unsqueeze(2).to(dist.mean)
        latents = latents[:, :, 0].float()
        mean, std = latent_stats(vae, latents)
        return (latents - mean) / std

    def decode_latents(self, model, latents):
        vae = model.vae
        mean, std = latent_stats(vae, latents.float())
        raw = (latents.float() * std + mean).to(vae.dtype).unsqueeze(2)
        return vae.decode(raw, return_dict=False)[0][:, :3, 0].clamp(-1, 1)

    # ---- objective and forward
    def objective(self, model):
        c = model.scheduler_config
        return UnpackedFlowObjective(shift=c.get("shift", 1.0), dynamic_shift=dynamic_shift(c))

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        import torch
        b, c, h, w = noisy.shape
        if h % 2 or w % 2:
            raise ConfigError(f"dataset.resolution: {self.label} needs image sides that are multiples of 32 px "
                              f"(got a {h * 16}×{w * 16} bucket)")
        tokens, shapes = flatten(noisy), []
        control = batch.get("control_latents")
        if control is not None:  # the control image's tokens first, the target's last
            control = control.to(noisy.device, noisy.dtype)
            tokens = torch.cat([flatten(control), tokens], dim=1)
            shapes.append((1, control.shape[-2], control.shape[-1]))
        shapes.append((1, h, w))
        hidden, mask = text["hidden"].to(noisy.device), text["mask"].to(noisy.device).bool()
        slots = text["image_slots"].to(noisy.device).bool()
        used = int(mask.sum(dim=1).max())  # padding after the longest caption of the batch: cut
        hidden, mask, slots = hidden[:, :used], mask[:, :used], slots[:, :used]
        image_mask = torch.cat([slots, slots.new_ones(b, h * w // 4)], dim=1)
        if control is not None and int(slots[0].sum()) * 4 != control.shape[-2] * control.shape[-1]:
            raise ConfigError(f"dataset.control_path: the text encoder saw {int(slots[0].sum())} vision tokens of the "
                              f"control image but its latents need {control.shape[-2] * control.shape[-1] // 4}; "
                              "the processor resized it (control images above its max_pixels)")
        call = dict(hidden_states=tokens.to(dtype), timestep=(timesteps / 1000).to(dtype),
                    encoder_hidden_states=hidden.to(dtype), img_shapes=[shapes] * b, return_dict=False)
        if noisy.device.type == "meta":  # the memory planner's probe: the layout from its known values
            from .meta_layout import layout_on_meta
            slots_cpu = torch.zeros(b, hidden.shape[1], dtype=torch.bool)  # captions only (no control image)
            with layout_on_meta(getattr(denoiser, "module", denoiser)):
                out = denoiser(**call, img_mask=torch.cat([slots_cpu, slots_cpu.new_ones(b, h * w // 4)], dim=1))[0]
        else:
            out = denoiser(**call, encoder_hidden_states_mask=None if mask.all() else mask, img_mask=image_mask)[0]
        return out[:, -h * w:].transpose(1, 2).reshape(b, c, h, w)

    # ---- sampling and outputs
    def pipeline_class(self):
        from diffusers import QwenImage21Pipeline
        return QwenImage21Pipeline

    def pipeline_parts(self, model) -> dict:
        return {"text_encoder": model.text_encoders[0], "processor": model.tokenizers[0]}

    def pipeline_call_options(self, model) -> dict:
        return {}

    def guidance_arguments(self, model, scale):
        return {"true_cfg_scale": scale}  # true CFG with a negative prompt (none without one)

    def lora_file_state(self, model, adapter_states, alpha, layout="auto"):
        state = super().lora_file_state(model, adapter_states, alpha, "diffusers")
        if self.lora_layout(layout) == "original":  # ComfyUI's names, gate and up joined on img_mlp.gate_up
            from .lora_keys import to_original
            return to_original(state)
        return state

    def read_lora_file(self, model, state, modules):
        from .lora_keys import is_original, to_diffusers
        return super().read_lora_file(model, to_diffusers(state) if is_original(state) else state, modules)

    def export_single_file(self, model, single_file, dtype, metadata) -> Path:
        from ..sd.single_file import META_ARCH
        return super().export_single_file(model, single_file, dtype, {**(metadata or {}), META_ARCH: self.name})

    def save_pipeline_folder(self, model, folder: Path) -> None:
        # diffusers cannot save the processor without torchvision: text.py writes it
        pipe = self.build_pipeline(model, "default")
        processor = pipe.processor
        pipe.register_modules(processor=None)
        pipe.save_pretrained(str(folder), safe_serialization=True)
        qtext.save_processor(processor, folder / "processor", folder / "model_index.json")


def _to_pil(pixels):
    from ..qwen_image.text import to_pil
    return to_pil(pixels)


def qtext_image(image):
    """A control image as the pipeline hands it to the processor (RGB: the alpha is opaque)."""
    return image.convert("RGB")


QWEN_IMAGE_21 = QwenImage21Family()
