"""Ideogram 4 behind the family contract: an Ideogram4Transformer2DModel trained with rectified flow on
the AutoencoderKLFlux2's latents, 2x2-patchified channel-last (py, px, c) and normalised by the VAE's
batch-norm statistics in that order, one token per patch, as Ideogram4Pipeline decodes them; conditioned
on 13 tapped Qwen3-VL layers concatenated per token of the chat-templated caption (usually Ideogram's
JSON caption, data/caption_json.py), left-padded, and packed as [text][image] with the pipeline's own
position, segment and indicator ids. The transformer's time runs the other way (0 = noise, 1 = data) and
it predicts data − noise: `predict` hands the loop the usual noise − data.

The pipeline's asymmetric guidance blends in a second, unconditional transformer: it is not trained
(the LoRA loader reads `transformer` only) and is loaded from the model's folder when samples need it.
"""
from __future__ import annotations

import math
from pathlib import Path

from ...errors import ConfigError
from ..flow_common import FlowFamily, device_of as _device, unwrap as _unwrap
from ..objectives import FlowMatchObjective

PIPELINES = ("Ideogram4Pipeline",)
DEFAULT_TEXT_LENGTH = 512   # tokens per cached caption (the pipeline's cap is 2048; a JSON caption is ~150-400)
BASE_PIXELS = 512 * 512     # the pipeline's _resolution_aware_mu base


class Ideogram4Objective(FlowMatchObjective):
    """Rectified flow whose σ density follows the pipeline's resolution-aware logit-normal schedule: its
    mean moves by ½·log(pixels / 512²), which is the shift √(pixels) / 512 applied to σ (shift_sigma on
    a logit-normal draw adds log(shift) to its mean). loss.flow_shift > 0 replaces it."""

    def __init__(self, cell: int = 16):
        super().__init__()
        self.cell = cell  # pixels per token along one side (the VAE's 8 x the 2x2 patch)

    def _shift(self, latent_shape, loss):
        if loss.flow_shift > 0:
            return loss.flow_shift
        pixels = latent_shape[-2] * self.cell * latent_shape[-1] * self.cell
        return math.sqrt(pixels / BASE_PIXELS)


class Ideogram4Family(FlowFamily):
    name = "ideogram4"
    label = "Ideogram 4"
    short_label = "Ideogram 4"
    text_encoder_names = ("text_encoder",)
    trained_text_encoders = ()  # Qwen3-VL stays frozen: diffusers' Ideogram 4 LoRA loader reads the transformer only
    full_single_file = "denoiser"  # the transformer alone in the original layout (original_file.py)
    transformer_file_module = ".ideogram4.original_file"
    text_encoder_file_options = ("text_encoder",)
    component_files_loader = ".ideogram4.components:load_ideogram4_files"
    # what ai-toolkit trains and diffusers' converter maps (its fused qkv split into to_q/k/v, attention.o,
    # the SwiGLU w1/w2/w3): every block's attention and MLP
    default_targets = ("to_q", "to_k", "to_v", "to_out.0", "feed_forward.w1", "feed_forward.w2", "feed_forward.w3")
    text_cache_dtype = "bfloat16"  # Qwen3's residual stream has outliers beyond fp16's comfort
    keep_unquantized = ("input_proj", "llm_cond_proj", "t_embedding", "adaln_proj", "embed_image_indicator",
                        "final_layer")
    block_patterns = ((r"^layers\.(\d+)\.", "block_{0:02d}"),
                      (r"^(?:input_proj|llm_cond_norm|llm_cond_proj|t_embedding|adaln_proj|embed_image_indicator)\b",
                       "BASE"), (r"^final_layer\b", "END"))
    base_model_version = "ideogram4"
    network_module = "networks.lora_ideogram4"
    modelspec_implementation = "diffusers"
    modelspec_architecture = "ideogram-4"

    # ---- detection and loading
    def detect_folder(self, folder: Path, index: dict) -> bool:
        return index.get("_class_name", "") in PIPELINES

    def detect_file(self, shapes, metadata) -> bool:
        return any(k.endswith("llm_cond_proj.weight") for k in shapes) and any(
            k.endswith("embed_image_indicator.weight") for k in shapes)

    def folder_pipeline(self, src: Path):
        """The unconditional transformer is loaded only when samples need it (unconditional_transformer)."""
        return self.pipeline_class(), {"unconditional_transformer": None}

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny import build_tiny_ideogram4
        return build_tiny_ideogram4(out_dir, seed=seed)

    def meta_denoiser(self):
        import torch
        from diffusers import Ideogram4Transformer2DModel
        from ..component_files import bundled
        with torch.device("meta"):
            return Ideogram4Transformer2DModel.from_config(bundled("ideogram4", "transformer.json"))

    # ---- text
    def text_length(self, model) -> int:
        """model.t5_max_length (tokens per caption), else 512; at most the pipeline's 2048."""
        return min(model.text_max_length or DEFAULT_TEXT_LENGTH, 2048)

    def t5_length(self, model) -> int:
        return self.text_length(model)

    def tokenize(self, model, captions, max_token_length):
        """[input_ids, attention_mask], left-padded as Ideogram4Pipeline.encode_prompt lays them out: each
        caption as the user's turn (one text part) with the generation prompt; longer ones keep their start."""
        import torch
        tok, length = model.tokenizers[0], self.text_length(model)
        ids = torch.zeros(len(captions), length, dtype=torch.long)
        mask = torch.zeros(len(captions), length, dtype=torch.long)
        for b, caption in enumerate(captions):
            messages = [{"role": "user", "content": [{"type": "text", "text": caption}]}]
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            tokens = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0][:length]
            ids[b, length - len(tokens):] = tokens
            mask[b, length - len(tokens):] = 1
        return [ids, mask]

    def encode_text(self, model, input_ids, encoders=None):
        """The pipeline's own tap of Qwen3-VL's layers (_get_text_encoder_hidden_states), concatenated per
        token and zeroed at the padding: {"hidden": [B, L, 13·D], "mask": [B, L]} (left-padded)."""
        import torch
        from diffusers import Ideogram4Pipeline
        encoder = _unwrap((encoders or model.text_encoders)[0])
        device = _device(encoder)
        ids, mask = input_ids[0].to(device), input_ids[1].to(device)
        positions = (mask.cumsum(dim=1) - 1).clamp_min(0) * mask  # arange(n) over each caption's tokens
        with torch.no_grad():
            taps = text_taps(encoder, ids, mask, positions)
        b, length = ids.shape
        hidden = torch.stack(taps, dim=0).permute(1, 2, 3, 0).reshape(b, length, -1)
        return {"hidden": (hidden * mask.to(hidden.dtype).unsqueeze(-1)).float(), "mask": mask}

    # ---- latents
    def latent_shape(self, model, height, width):
        f = model.vae_scale_factor * 2
        return (model.vae.config.latent_channels * 4, height // f, width // f)

    def encode_latents(self, model, pixels, eps):
        """Posterior mean (or sample with `eps`, drawn in the patchified shape), patchified 2x2 channel-last
        as the pipeline unpacks its tokens, then (x - bn.mean) / sqrt(bn.var + eps) in that order."""
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
        return Ideogram4Objective(cell=model.vae_scale_factor * 2)

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        """The conditional pass of Ideogram4Pipeline.__call__: [text][image] packed with _prepare_ids, model
        time 1 − σ; padding beyond the batch's longest caption is cut (its own segment: it changes nothing)."""
        import torch
        from diffusers import Ideogram4Pipeline
        b, c, h, w = noisy.shape
        device = noisy.device
        hidden, mask = text["hidden"].to(device), text["mask"].to(device)
        if mask.is_meta:  # the memory probe (training/memory_probe.py): every caption at full length
            used, lengths = mask.shape[1], [mask.shape[1]] * b
        else:
            used = int(mask.sum(dim=1).max())
            lengths = [int(n) for n in mask.sum(dim=1)]
        hidden, mask = hidden[:, hidden.shape[1] - used:], mask[:, mask.shape[1] - used:]
        positions, segments, indicator = Ideogram4Pipeline._prepare_ids(lengths, h, w, used, device)
        tokens = noisy.reshape(b, c, h * w).permute(0, 2, 1)
        packed = torch.cat([torch.zeros(b, used, c, device=device, dtype=tokens.dtype), tokens], dim=1)
        features = torch.cat([hidden, torch.zeros(b, h * w, hidden.shape[-1], device=device, dtype=hidden.dtype)],
                             dim=1)
        model_time = (1.0 - timesteps.float() / 1000).to(device)
        rope = _unwrap(denoiser).rotary_emb
        if noisy.is_meta:  # the memory probe: its rotary embedding's autocast guard knows no meta device
            rope.forward = lambda pos: (torch.empty(*pos.shape[:2], rope.head_dim, device="meta"),) * 2
        try:
            out = denoiser(hidden_states=packed.to(dtype), timestep=model_time.to(dtype),
                           encoder_hidden_states=features.to(dtype), position_ids=positions, segment_ids=segments,
                           indicator=indicator, return_dict=False)[0]
        finally:
            if noisy.is_meta:
                del rope.forward
        velocity = out[:, used:].permute(0, 2, 1).reshape(b, c, h, w)
        return -velocity  # data − noise -> the loop's noise − data

    def use_plain_attention(self, model):
        model.denoiser.set_attention_backend("_native_math")

    def blocks(self, model):
        return list(model.denoiser.layers)

    # ---- sampling and outputs
    def pipeline_class(self):
        from diffusers import Ideogram4Pipeline
        return Ideogram4Pipeline

    def unconditional_transformer(self, model):
        """The pipeline's unconditional transformer from the model's folder (loaded once, on the trained
        transformer's device, frozen)."""
        loaded = getattr(model, "_unconditional_transformer", None)
        if loaded is None:
            import torch
            from diffusers import Ideogram4Transformer2DModel
            from ..sd.loader import _first_line
            source = Path(model.source)  # separate files: model.tokenizer's folder (components.py)
            root = source if source.is_dir() else Path(model.options.get("unconditional_folder") or "")
            if not (root / "unconditional_transformer").is_dir():
                raise ConfigError(f"model.tokenizer: samples need Ideogram 4's unconditional transformer, which "
                                  f"{Path(model.source).name} does not hold; set model.tokenizer to an Ideogram 4 "
                                  "diffusers folder (with unconditional_transformer/), or draw no samples")
            folder = root / "unconditional_transformer"
            try:
                loaded = Ideogram4Transformer2DModel.from_pretrained(str(folder), local_files_only=True,
                                                                     dtype=torch.float32)
            except (OSError, ValueError) as e:
                raise ConfigError(f"model.path: cannot load {folder} ({_first_line(e)})") from None
            loaded.requires_grad_(False).eval()
            model._unconditional_transformer = loaded
        denoiser = _unwrap(model.denoiser)
        weight = next(p for p in denoiser.parameters() if p.is_floating_point())
        compute = weight.dtype if weight.dtype in (_torch().float32, _torch().bfloat16, _torch().float16) \
            else _torch().bfloat16
        return loaded.to(device=weight.device, dtype=compute)

    def build_pipeline(self, model, scheduler: str = "euler"):
        """The pipeline, and the unpacking its latent output needs before the VAE (diffusion/sampling.py)."""
        pipe = super().build_pipeline(model, scheduler)
        pipe._get_text_encoder_hidden_states = text_taps  # the same tap, through the offload hooks
        cell = pipe.vae_scale_factor * pipe.patch_size
        pipe.latents_to_vae = lambda latents, height, width: tokens_to_vae(pipe.vae, latents, height // cell,
                                                                             width // cell)
        return pipe

    def lora_file_state(self, model, adapter_states, alpha, layout="auto"):
        if self.lora_layout(layout) == "original":  # ai-toolkit's / the original names (fused qkv): lora_keys.py
            from .lora_keys import to_original_lora
            return to_original_lora(adapter_states, alpha, _unwrap(model.denoiser))
        return super().lora_file_state(model, adapter_states, alpha, layout)

    def export_single_file(self, model, single_file, dtype, metadata) -> Path:
        """The trained transformer alone in the original (published, ComfyUI) layout: original_file.py;
        the folder holds the whole pipeline."""
        from ..sd.single_file import META_ARCH
        from .original_file import export_transformer
        return export_transformer(_unwrap(model.denoiser), single_file, dtype, {**(metadata or {}), META_ARCH: self.name})

    def pipeline_parts(self, model) -> dict:
        return {"text_encoder": model.text_encoders[0], "tokenizer": model.tokenizers[0],
                "unconditional_transformer": self.unconditional_transformer(model)}

    def guidance_arguments(self, model, scale):
        # a constant scale replaces the pipeline's default per-step schedule (it refuses both)
        return {"guidance_scale": scale, "guidance_schedule": None}

    def prompt_arguments(self, model, prompt, negative):
        return {"prompt": prompt}  # asymmetric guidance: the unconditional transformer reads no text

    def pipeline_call_options(self, model) -> dict:
        return {"max_sequence_length": self.text_length(model)}


def tokens_to_vae(vae, tokens, grid_h: int, grid_w: int):
    """The pipeline's latent output (normalised tokens [B, N, 4C] of a grid_h x grid_w grid) -> the VAE's
    latents, as its decode does."""
    import torch
    mean = vae.bn.running_mean.view(1, 1, -1).to(tokens)
    std = torch.sqrt(vae.bn.running_var + vae.config.batch_norm_eps).view(1, 1, -1).to(tokens)
    z = (tokens * std + mean).permute(0, 2, 1).reshape(tokens.shape[0], -1, grid_h, grid_w)
    return unpatchify(z)


def text_taps(encoder, ids, mask, positions) -> list:
    """Ideogram4Pipeline._get_text_encoder_hidden_states as a call of the encoder's language model, so its
    forward hooks run (memory.offload_encoders brings it and the inputs to the device there): the
    pipeline's tap calls the language model's parts directly."""
    from types import SimpleNamespace
    from diffusers import Ideogram4Pipeline
    language_model = encoder.language_model
    language_model.forward = lambda *moved: Ideogram4Pipeline._get_text_encoder_hidden_states(
        SimpleNamespace(language_model=language_model), *moved)
    try:
        return language_model(ids, mask, positions)
    finally:
        del language_model.forward


def _torch():
    import torch
    return torch


def patchify(latents):
    """[B, C, H, W] -> [B, 4C, H/2, W/2], channel-last (py, px, c) as Ideogram4Pipeline unpacks its tokens."""
    b, c, h, w = latents.shape
    return latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 3, 5, 1, 2, 4).reshape(b, c * 4, h // 2, w // 2)


def unpatchify(latents):
    """The inverse of patchify."""
    b, c, h, w = latents.shape
    return latents.reshape(b, 2, 2, c // 4, h, w).permute(0, 3, 4, 1, 5, 2).reshape(b, c // 4, h * 2, w * 2)


IDEOGRAM4 = Ideogram4Family()
