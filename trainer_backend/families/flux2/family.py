"""Flux.2 Klein (4B, 9B; base and distilled) and Flux.2 dev behind the family contract: a
Flux2Transformer2DModel trained with rectified flow on the AutoencoderKLFlux2's latents, 2x2-patchified
(32 -> 128 channels) and normalised by the VAE's batch-norm statistics, one token per patch; conditioned
on three hidden layers stacked of the chat-templated caption, as the model's pipeline encodes it (its
Flux2Variant): Klein's Qwen3 layers 9, 18 and 27 of 36 (Flux2KleinPipeline), dev's Mistral Small 3
layers 10, 20 and 30 of 40 after the pipeline's system message (Flux2Pipeline). dev's transformer also
takes the distilled guidance value (model.guidance while training, as Flux.1 dev).

Reference (control) images are optional, as in the pipeline: their latents become extra tokens after
the image's, at time coordinate 10 of the 4-axis position ids, and only the image's tokens are trained.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..flow_common import FlowFamily, dynamic_shift, device_of as _device, unwrap as _unwrap
from ..objectives import FlowMatchObjective, resolution_shift

TEXT_MAX_LENGTH = 512  # both pipelines' max_sequence_length
REFERENCE_TIME = 10    # the pipelines' time coordinate of the first reference image


@dataclass(frozen=True)
class Flux2Variant:
    """What differs between the Flux.2 models, all read from their pipelines."""
    name: str
    pipelines: tuple[str, ...]      # model_index.json _class_name values; the first samples
    hidden_layers: tuple[int, ...]  # the pipeline's text_encoder_out_layers
    encoder_prefix: str             # the text encoder's transformers class name starts so


KLEIN = Flux2Variant("klein", ("Flux2KleinPipeline", "Flux2KleinKVPipeline"), (9, 18, 27), "Qwen3")
DEV = Flux2Variant("dev", ("Flux2Pipeline",), (10, 20, 30), "Mistral3")
VARIANTS = (KLEIN, DEV)
PIPELINES = tuple(p for v in VARIANTS for p in v.pipelines)


def variant_of(encoder) -> Flux2Variant:
    """The variant a text encoder belongs to (Qwen3 -> Klein, Mistral-3 -> dev)."""
    name = type(_unwrap(encoder)).__name__
    return next((v for v in VARIANTS if name.startswith(v.encoder_prefix)), KLEIN)


def folder_variant(folder: Path) -> Flux2Variant:
    try:
        name = json.loads((Path(folder) / "model_index.json").read_text()).get("_class_name", "")
    except (OSError, json.JSONDecodeError):
        name = ""
    return next((v for v in VARIANTS if name in v.pipelines), KLEIN)


def pipeline_named(name: str):
    import diffusers
    return getattr(diffusers, name)


class Flux2Objective(FlowMatchObjective):
    """Rectified flow with Flux's resolution-dependent shift counted on Flux.2's tokens: one per latent
    cell of the patchified latent (Flux.1 packs 2x2 cells of its own latent into one)."""

    def _shift(self, latent_shape, loss):
        if loss.flow_shift > 0 or self.dynamic_shift is None:
            return super()._shift(latent_shape, loss)
        return resolution_shift(latent_shape[-2] * latent_shape[-1], **self.dynamic_shift)


class Flux2Family(FlowFamily):
    name = "flux2"
    label = "Flux.2 (Klein 4B, 9B; dev)"
    text_encoder_names = ("text_encoder",)
    trained_text_encoders = ()  # Qwen3 / Mistral stay frozen: diffusers' Flux.2 LoRA loader reads transformer adapters only
    full_single_file = "denoiser"
    # the double blocks' attention on both streams, the single blocks' fused qkv + MLP input
    default_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                       "to_qkv_mlp_proj")
    text_encoder_file_options = ("text_encoder",)
    short_label = "Flux.2"
    component_files_loader = ".flux2.components:load_flux2_files"
    # Flux.2's timestep (and dev's guidance) embedder stays unquantized, as Flux.1's time_text_embed
    keep_unquantized = (*FlowFamily.keep_unquantized, "time_guidance_embed")
    # Qwen3's residual stream has outlier activations in the thousands: cached in bf16 (fp16's range is narrow)
    text_cache_dtype = "bfloat16"
    block_patterns = ((r"^transformer_blocks\.(\d+)\.", "double_{0:02d}"),
                      (r"^single_transformer_blocks\.(\d+)\.", "single_{0:02d}"),
                      (r"^(?:x_embedder|context_embedder|time_guidance_embed|double_stream_modulation_img|"
                       r"double_stream_modulation_txt|single_stream_modulation)\.", "BASE"),
                      (r"^(?:norm_out|proj_out)\b", "END"))
    base_model_version = "flux_2"   # the loaded variant's, as musubi-tuner writes it (base_model_version_of)
    network_module = "networks.lora_flux_2"
    modelspec_implementation = "https://github.com/black-forest-labs/flux2"
    # the loaded variant's, as SwarmUI classifies them: flux.2-klein-4b, flux.2-klein-9b, flux.2-dev
    modelspec_architecture = "flux.2"
    transformer_file_module = ".flux2.original_keys"
    control_images = "optional"
    control_image_argument = "image"

    # ---- detection and loading
    def detect_folder(self, folder: Path, index: dict) -> bool:
        return index.get("_class_name", "") in PIPELINES

    def detect_file(self, shapes, metadata) -> bool:
        return any(k.endswith("single_stream_modulation.lin.weight") for k in shapes)

    def folder_pipeline(self, src: Path) -> tuple[type, dict]:
        """Klein folders load with their own pipeline; a dev folder's tokenizer slot (a PixtralProcessor,
        which needs torchvision) is left out there and loaded by load_folder."""
        if folder_variant(src) is DEV:
            return pipeline_named(DEV.pipelines[0]), {"tokenizer": None}
        return pipeline_named(KLEIN.pipelines[0]), {}

    def load_folder(self, src: Path, *, vae: str = "", prediction_type: str = "auto"):
        """A dev folder's tokenizer: the tokenizer inside its processor, the part text encoding uses."""
        model = super().load_folder(src, vae=vae, prediction_type=prediction_type)
        if folder_variant(src) is DEV:
            from ...errors import ConfigError
            from .mistral_file import load_mistral_tokenizer
            try:
                model.tokenizers = [load_mistral_tokenizer(src / "tokenizer")]
            except (OSError, ValueError) as e:
                raise ConfigError(f"model.path: {src / 'tokenizer'} holds no Flux.2 dev tokenizer "
                                  f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        return model

    def model_pipeline_class(self, model):
        return pipeline_named(variant_of(model.text_encoders[0]).pipelines[0])

    def build_tiny(self, out_dir, seed: int = 0, variant: str = "klein", **options) -> Path:
        """variant "klein" (Qwen3, Flux2KleinPipeline) or "dev" (Mistral-3, guidance, Flux2Pipeline)."""
        from .tiny import build_tiny_flux2
        return build_tiny_flux2(out_dir, seed=seed, dev=variant == "dev")

    def meta_denoiser(self, size: str = "klein-4b"):
        """The full-size transformer on the meta device: klein-4b (default), klein-9b or dev."""
        import torch
        from diffusers import Flux2Transformer2DModel
        from .components import bundled
        with torch.device("meta"):
            return Flux2Transformer2DModel.from_config(bundled(f"transformer-{size}.json"))

    # ---- text
    def text_length(self, model) -> int:
        """model.t5_max_length (tokens per caption), else the pipeline's 512, within the tokenizer's limit."""
        return min(model.text_max_length or TEXT_MAX_LENGTH, model.tokenizers[0].model_max_length)

    def tokenize(self, model, captions, max_token_length):
        """The chat-templated captions as the model's pipeline renders them: [input_ids, attention_mask].
        Klein: the caption as the user's turn with the generation prompt (thinking off); dev: the
        pipeline's system message and the caption (format_input, [IMG] removed), no generation prompt."""
        tok = model.tokenizers[0]
        if variant_of(model.text_encoders[0]) is DEV:
            from diffusers.pipelines.flux2.pipeline_flux2 import format_input
            from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
            enc = tok.apply_chat_template(format_input(prompts=list(captions), system_message=SYSTEM_MESSAGE),
                                          add_generation_prompt=False, tokenize=True, return_dict=True,
                                          return_tensors="pt", padding="max_length", truncation=True,
                                          max_length=self.text_length(model))
            return [enc["input_ids"], enc["attention_mask"]]
        texts = [tok.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                         add_generation_prompt=True, enable_thinking=False) for c in captions]
        enc = tok(texts, padding="max_length", truncation=True, max_length=self.text_length(model),
                  return_tensors="pt")
        return [enc.input_ids, enc.attention_mask]

    @staticmethod
    def hidden_layers(encoder) -> tuple[int, ...]:
        """The stacked hidden states: the pipeline's (Klein (9, 18, 27) of Qwen3's 36 layers, dev (10, 20,
        30) of Mistral Small's 40; an encoder deeper than the last has them all); a shallower encoder:
        its quarter points."""
        layers = variant_of(encoder).hidden_layers
        config = _unwrap(encoder).config
        n = getattr(config, "text_config", config).num_hidden_layers
        return layers if n > layers[-1] else (n // 4, n // 2, 3 * n // 4)

    def encode_text(self, model, input_ids, encoders=None):
        import torch
        encoder = _unwrap((encoders or model.text_encoders)[0])
        body = getattr(encoder, "model", encoder)  # the decoder stack: no logits over the vocabulary
        device = _device(encoder)
        with torch.no_grad():  # the text encoder is never trained here: no graph, no activations kept
            out = body(input_ids=input_ids[0].to(device), attention_mask=input_ids[1].to(device),
                       output_hidden_states=True, use_cache=False)
        stacked = torch.stack([out.hidden_states[k] for k in self.hidden_layers(encoder)], dim=1)
        b, n, length, width = stacked.shape
        return {"hidden": stacked.permute(0, 2, 1, 3).reshape(b, length, n * width)}

    def use_plain_attention(self, model):
        """precision.attention = "default": Flux.2's attention through PyTorch's math kernel (its processors
        are not diffusers' AttnProcessor kind)."""
        model.denoiser.set_attention_backend("_native_math")

    # ---- latents
    def latent_shape(self, model, height, width):
        f = model.vae_scale_factor * 2
        return (model.vae.config.latent_channels * 4, height // f, width // f)

    def encode_latents(self, model, pixels, eps):
        """Posterior mean (or sample with `eps`, drawn in the patchified shape), patchified 2x2 with the
        channel-major order of the pipeline's _patchify_latents, then (x - bn.mean) / sqrt(bn.var + eps)."""
        import torch
        vae = model.vae
        dist = vae.encode(pixels.to(vae.dtype)).latent_dist
        latents = dist.mean
        if eps is not None:
            latents = latents + dist.std * unpatchify(eps.to(latents))
        latents = patchify(latents.float())
        mean = vae.bn.running_mean.view(1, -1, 1, 1).to(latents)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1).to(latents) + vae.config.batch_norm_eps)
        return (latents - mean) / std

    # ---- objective and forward
    def objective(self, model):
        c = model.scheduler_config
        return Flux2Objective(shift=c.get("shift", 1.0), dynamic_shift=dynamic_shift(c))

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        """dev's transformer also takes the distilled guidance value: model.guidance (1.0 by default)."""
        import torch
        b, c, h, w = noisy.shape
        device = noisy.device
        tokens = noisy.reshape(b, c, h * w).permute(0, 2, 1)
        ids = grid_ids(0, h, w)
        if batch.get("control_latents") is not None:
            ref = batch["control_latents"].to(device, noisy.dtype)
            tokens = torch.cat([tokens, ref.reshape(b, c, -1).permute(0, 2, 1)], dim=1)
            ids = torch.cat([ids, grid_ids(REFERENCE_TIME, ref.shape[-2], ref.shape[-1])], dim=0)
        hidden = text["hidden"].to(device, dtype)
        txt_ids = torch.zeros(hidden.shape[1], 4, dtype=torch.long)
        txt_ids[:, 3] = torch.arange(hidden.shape[1])
        guidance = None
        if getattr(_unwrap(denoiser).config, "guidance_embeds", False):
            value = cfg.model.guidance if cfg is not None else 1.0
            guidance = torch.full((b,), float(value), device=device, dtype=torch.float32)
        out = denoiser(hidden_states=tokens.to(dtype), encoder_hidden_states=hidden,
                       timestep=(timesteps / 1000).to(dtype), img_ids=ids.to(device), txt_ids=txt_ids.to(device),
                       guidance=guidance, return_dict=False)[0]
        return out[:, : h * w].permute(0, 2, 1).reshape(b, c, h, w)

    # ---- sampling and outputs
    def pipeline_class(self):
        """Klein's pipeline (diffusers' Flux.2 LoRA converters, which dev's shares); a model's own:
        model_pipeline_class."""
        return pipeline_named(KLEIN.pipelines[0])

    def prompt_arguments(self, model, prompt, negative):
        """Flux2KleinPipeline takes no negative prompt text: a negative prompt goes in as embeddings.
        Flux2Pipeline (dev, guidance-distilled) takes none at all: samples leave it out, as it does."""
        out = {"prompt": prompt}
        if negative and variant_of(model.text_encoders[0]) is KLEIN:
            import torch
            texts = [negative] if isinstance(negative, str) else list(negative)
            with torch.no_grad():
                out["negative_prompt_embeds"] = self.encode_text(model, self.tokenize(model, texts, 0))["hidden"]
        return out

    def build_pipeline(self, model, scheduler: str = "euler"):
        """dev's Flux2Pipeline returns its latent output still packed (one token per 2x2 patch, normalised),
        where Klein's unpacks first: dev's pipeline gets the unpacking sampling needs before the VAE
        (diffusion/sampling.py latents_to_vae), done by the pipeline's own helpers."""
        pipe = super().build_pipeline(model, scheduler)
        if variant_of(model.text_encoders[0]) is DEV:
            pipe.latents_to_vae = lambda latents, height, width: tokens_to_latents(pipe, latents, height, width)
        return pipe

    def pipeline_call_options(self, model) -> dict:
        return {"max_sequence_length": self.text_length(model),
                "text_encoder_out_layers": self.hidden_layers(model.text_encoders[0])}

    def pipeline_parts(self, model) -> dict:
        parts = super().pipeline_parts(model)
        if variant_of(model.text_encoders[0]) is KLEIN:  # Flux2Pipeline has no such argument
            parts["is_distilled"] = _is_distilled(model.source)
        return parts

    def variant_name(self, model) -> str:
        """klein-4b, klein-9b or dev: Klein 9B's transformer reads Qwen3-8B's 3 x 4096 features, 4B's
        Qwen3-4B's 3 x 2560 (a tiny test model counts as 4B)."""
        if variant_of(model.text_encoders[0]) is DEV:
            return "dev"
        width = getattr(_unwrap(model.denoiser).config, "joint_attention_dim", 0)
        return "klein-9b" if width >= 3 * 4096 else "klein-4b"

    def architecture(self, model) -> str:
        """flux.2-klein-4b, flux.2-klein-9b or flux.2-dev (modelspec.architecture; LoRA files add /lora)."""
        return f"{self.modelspec_architecture}-{self.variant_name(model)}"

    def base_model_version_of(self, model) -> str:
        """musubi-tuner's: flux_2_klein_4b, flux_2_klein_9b, flux_2_dev."""
        return "flux_2_" + self.variant_name(model).replace("-", "_")

    def lora_file_state(self, model, adapter_states, alpha, layout="auto"):
        if self.lora_layout(layout) == "kohya":
            from .kohya_lora import to_kohya_flux2
            return to_kohya_flux2(adapter_states, alpha, model.denoiser)
        return super().lora_file_state(model, adapter_states, alpha, layout)


def tokens_to_latents(pipe, tokens, height: int, width: int):
    """Flux2Pipeline's packed latent output [B, tokens, 4C] -> the VAE's [B, C, H/8, W/8], as its own decode
    branch does: tokens scattered by their position ids, the batch-norm statistics undone, unpatchified."""
    import torch
    cell = pipe.vae_scale_factor * 2
    grid = torch.zeros(tokens.shape[0], 1, int(height) // cell, int(width) // cell)
    latents = pipe._unpack_latents_with_ids(tokens, pipe._prepare_latent_ids(grid).to(tokens.device))
    vae = pipe.vae
    mean = vae.bn.running_mean.view(1, -1, 1, 1).to(latents)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1).to(latents) + vae.config.batch_norm_eps)
    return pipe._unpatchify_latents(latents * std + mean)


def patchify(latents):
    """[B, C, H, W] -> [B, 4C, H/2, W/2], channel-major (c, dy, dx) as Flux2KleinPipeline._patchify_latents."""
    b, c, h, w = latents.shape
    return latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, c * 4, h // 2, w // 2)


def unpatchify(latents):
    """The inverse of patchify."""
    b, c, h, w = latents.shape
    return latents.reshape(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c // 4, h * 2, w * 2)


def grid_ids(time: int, h: int, w: int):
    """4-axis position ids (t, y, x, layer) of an h×w token grid, row-major as the pipeline's."""
    import torch
    return torch.cartesian_prod(torch.tensor([time]), torch.arange(h), torch.arange(w), torch.tensor([0]))


def _is_distilled(source: str) -> bool:
    index = Path(source) / "model_index.json"
    try:
        return bool(json.loads(index.read_text()).get("is_distilled", False)) if index.is_file() else False
    except (OSError, json.JSONDecodeError):
        return False


FLUX2 = Flux2Family()
