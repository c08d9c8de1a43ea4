"""LTX-2 (Lightricks' audio-video model) behind the family contract, video LoRA: flow matching on the
normalised latents of the LTX-2 video VAE (32x spatial, 8x temporal in the full model: a clip's frame counts
are 8k+1), packed into tokens and shifted as LTX2Pipeline samples them (latents.py); Gemma 3 text (frozen)
through the pipeline's text connectors, which give the video and the audio stream their own embeddings.

The transformer always runs its audio stream. A clip window with an audio track (dataset.video_audio) trains
both: its audio's tokens (audio.py: log-mel -> audio VAE -> packed, normalised) are noised at the video's
timestep with their own noise, both streams attend to each other, and the loss adds the audio term
(diffusion/loss.py, loss.audio_loss_weight). A video-only sample (no audio track, or audio off) runs the audio
stream on one empty token with the audio<->video cross-attentions off (`isolate_modalities`), the way
Lightricks' trainer runs the video stream alone: the video prediction does not depend on made-up audio.
LoRA files: diffusers' layout (`transformer.…`, LTX2Pipeline.load_lora_weights) or ComfyUI's (lora_keys.py).
"""
from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ..base import LoadedModel
from ..folder_outputs import FolderOutputs
from ..flow_common import FlowFamily, device_of, unwrap
from ..objectives import FlowMatchObjective
from . import audio as aud
from . import latents as lat

DEFAULT_TEXT_LENGTH = 1024   # LTX2Pipeline's max_sequence_length
# the video stream's attentions and feed-forward (peft names: `attn1.to_q` does not match `audio_attn1.to_q`)
VIDEO_TARGETS = tuple(f"{a}.{p}" for a in ("attn1", "attn2") for p in ("to_q", "to_k", "to_v", "to_out.0")) + \
    ("ff.net.0.proj", "ff.net.2")


class VideoTokenObjective(FlowMatchObjective):
    """Rectified flow with LTX2Pipeline's resolution-dependent shift: exp(mu), mu linear in the clip's packed
    video token count (frames x height x width of the latent), from the scheduler config."""

    def __init__(self, scheduler_config: dict, patch: int, patch_t: int):
        super().__init__(shift=1.0)
        self.scheduler_config, self.patch, self.patch_t = scheduler_config, patch, patch_t

    def _shift(self, latent_shape, loss):
        if loss.flow_shift > 0:
            return loss.flow_shift
        # (L, D) audio tokens (loss.audio_timestep = "independent"): their count, as a clip's video tokens
        tokens = latent_shape[0] if len(latent_shape) == 2 else lat.token_count(latent_shape, self.patch, self.patch_t)
        return lat.sigma_shift(tokens, self.scheduler_config)


class LTX2Family(FolderOutputs, FlowFamily):
    name = "ltx2"
    label = "LTX-2"
    text_encoder_names = ("text_encoder",)
    trained_text_encoders = ()        # Gemma 3 stays frozen (diffusers' LTX-2 LoRA loader reads the transformer)
    text_cache_dtype = "bfloat16"
    full_single_file = None           # a full fine-tune: the diffusers folder
    default_targets = VIDEO_TARGETS
    keep_unquantized = ("proj_in", "audio_proj_in", "time_embed", "audio_time_embed", "caption_projection",
                        "audio_caption_projection", "norm_out", "proj_out", "audio_norm_out", "audio_proj_out")
    block_patterns = ((r"^(?:transformer\.)?transformer_blocks\.(\d+)\.", "block_{0:02d}"),
                      (r"^(?:proj_in|audio_proj_in|time_embed|audio_time_embed|caption_projection)\b", "BASE"),
                      (r"^(?:norm_out|proj_out|audio_norm_out|audio_proj_out)\b", "END"))
    base_model_version = "ltx2"
    network_module = "networks.lora"
    modelspec_architecture = "ltx-2"
    modelspec_implementation = "https://github.com/Lightricks/LTX-2"
    frame_step = 8
    default_fps = 24.0
    sample_frames = 17

    audio_stream = True

    def clip_audio(self, clips_with_audio: int, clips: int = 0, trained: int = 0) -> str:
        clips = max(clips, clips_with_audio)
        if not trained:
            why = "dataset.video_audio is off" if clips_with_audio else "no clip has an audio track"
            return f"not trained ({why}): the video stream only"
        silent = clips - trained
        return (f"trained on {trained} of {clips} clips" +
                (f"; {silent} {'has' if silent == 1 else 'have'} no audio track (video only)" if silent else ""))

    def audio_format(self, model) -> tuple[int, int]:
        vae, stream = model.options["audio_vae"], unwrap(model.denoiser).config.audio_in_channels
        if aud.token_width(vae) != stream:  # caught before any clip is encoded, not as a shape error mid-run
            raise ConfigError(f"model.path: {model.source}: its audio VAE gives {aud.token_width(vae)} features per "
                              f"audio step, its transformer's audio stream takes {stream}")
        return aud.audio_format(vae)

    def encode_audio(self, model, waveform):
        vae = model.options["audio_vae"].to(waveform.device)  # small (the full model's: 53M): joins the clip
        return aud.encode(vae, waveform)

    # ---- detection and loading
    def detect_folder(self, folder: Path, index: dict) -> bool:
        return index.get("_class_name", "") == "LTX2Pipeline"

    def detect_file(self, shapes, metadata) -> bool:
        return False  # diffusers folders only (single checkpoints: not yet)

    def load(self, src: Path, *, vae: str = "", prediction_type: str = "auto", tokenizer: str = "",
             text_encoder_files=None) -> LoadedModel:
        import torch
        from diffusers import LTX2Pipeline
        from ..sd.loader import _first_line
        if prediction_type not in ("auto", "flow"):
            raise ConfigError(f"model.prediction_type: {self.label} predicts the flow; use \"auto\"")
        if not src.is_dir():
            raise ConfigError(f"model.path: {src}: {self.label} loads from a diffusers folder (LTX2Pipeline)")
        if vae:
            raise ConfigError(f"model.vae: does not apply to {self.label} (its folder's VAE is used)")
        try:
            pipe = LTX2Pipeline.from_pretrained(str(src), local_files_only=True, dtype=torch.float32)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            raise ConfigError(f"model.path: cannot load {src} as a {self.label} model ({_first_line(e)})") from None
        return LoadedModel(family=self, denoiser=pipe.transformer, vae=pipe.vae, text_encoders=[pipe.text_encoder],
                           tokenizers=[pipe.tokenizer], noise_scheduler=pipe.scheduler, prediction_type="flow",
                           source=str(src), vae_scale_factor=pipe.vae.spatial_compression_ratio,
                           scheduler_config=dict(pipe.scheduler.config),
                           options={"connectors": pipe.connectors, "audio_vae": pipe.audio_vae,
                                    "vocoder": pipe.vocoder})

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny import build_tiny_ltx2
        return build_tiny_ltx2(out_dir, seed=seed)

    def meta_denoiser(self):
        from .lora_keys import meta_transformer
        return meta_transformer()

    # ---- text
    def t5_length(self, model) -> int:
        """Tokens per caption: model.t5_max_length, else LTX2Pipeline's 1024 (or the tokenizer's own length
        when shorter: the tiny model's 64)."""
        own = min(getattr(model.tokenizers[0], "model_max_length", DEFAULT_TEXT_LENGTH), DEFAULT_TEXT_LENGTH)
        return min(model.text_max_length or own, DEFAULT_TEXT_LENGTH)

    def tokenize(self, model, captions, max_token_length):
        tok = model.tokenizers[0]
        tok.padding_side = "left"  # as LTX2Pipeline: Gemma reads left-padded prompts
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        enc = tok([c.strip() for c in captions], padding="max_length", max_length=self.t5_length(model),
                  truncation=True, add_special_tokens=True, return_tensors="pt")
        return [enc.input_ids, enc.attention_mask]

    def encode_text(self, model, input_ids, encoders=None):
        """Every Gemma layer's hidden states through the text connectors (as LTX2Pipeline.__call__): the video
        and the audio stream's embeddings and their attention mask."""
        encoder = (encoders or model.text_encoders)[0]
        ids, mask = (t.to(device_of(encoder)) for t in input_ids)
        out = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        import torch
        stacked = torch.stack(out.hidden_states, dim=-1).flatten(2, 3)
        # the connectors (1.4B in the full model) go with the text encoder: its compute dtype, its device for the
        # call, and back to CPU memory after it when the encoder lives there (memory.offload_encoders)
        connectors, home = model.options["connectors"], device_of(encoder)
        connectors.to(stacked.device, dtype=stacked.dtype)
        video, audio, conn_mask = connectors(stacked, mask, padding_side=model.tokenizers[0].padding_side)
        if home != stacked.device:
            connectors.to(home)
        return {"prompt_embeds": video, "audio_prompt_embeds": audio, "prompt_attention_mask": conn_mask}

    # ---- latents
    def latent_shape(self, model, height, width, frames: int = 1):
        f = model.vae_scale_factor
        return (model.vae.config.latent_channels, (frames - 1) // self.frame_step + 1, height // f, width // f)

    def encode_latents(self, model, pixels, eps):
        vae = model.vae
        video = pixels if pixels.ndim == 5 else pixels.unsqueeze(2)   # an image is a 1-frame clip
        dist = vae.encode(video.to(vae.dtype)).latent_dist
        latents = dist.mean if eps is None else dist.mean + dist.std * eps.to(dist.mean)
        return lat.normalize(latents.float(), vae)

    def decode_latents(self, model, latents):
        vae = model.vae
        timestep = None
        if vae.config.timestep_conditioning:  # LTX2Pipeline's default decode_timestep 0, no decode noise
            import torch
            timestep = torch.zeros(latents.shape[0], device=latents.device)
        out = vae.decode(lat.denormalize(latents.float(), vae).to(vae.dtype), timestep, return_dict=False)[0]
        return out.clamp(-1, 1)

    # ---- objective and forward
    def objective(self, model):
        config = unwrap(model.denoiser).config
        return VideoTokenObjective(model.scheduler_config, config.patch_size, config.patch_size_t)

    def conditioning_fps(self, cfg) -> float:
        """The frame rate the video RoPE positions are conditioned on: the clips' sampled rate
        (dataset.video_fps), else the family's 24."""
        fps = getattr(getattr(cfg, "dataset", None), "video_fps", 0) if cfg is not None else 0
        return float(fps) if fps else self.default_fps

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        return self._forward(denoiser, noisy, None, timesteps, text, dtype, cfg)[0]

    def predict_audio_video(self, model, denoiser, noisy, noisy_audio, timesteps, text, batch, dtype, cfg=None,
                            audio_timesteps=None):
        return self._forward(denoiser, noisy, noisy_audio, timesteps, text, dtype, cfg, audio_timesteps)

    def _forward(self, denoiser, noisy, noisy_audio, timesteps, text, dtype, cfg, audio_timesteps=None):
        """The transformer on (B, C, F', h, w) video latents and (B, L, D) audio tokens at one timestep per
        sample (the audio's own when given; None audio: video only, the audio stream isolated on one empty
        token); (video, audio) predictions."""
        import torch
        config = unwrap(denoiser).config
        p, pt = config.patch_size, config.patch_size_t
        b, _, f, h, w = noisy.shape
        tokens = lat.pack(noisy.to(dtype), p, pt)
        isolated = noisy_audio is None
        audio = torch.zeros(b, 1, config.audio_in_channels, device=noisy.device, dtype=dtype) if isolated \
            else noisy_audio.to(noisy.device, dtype)
        t = timesteps.to(noisy.device, dtype)
        audio_t = t if audio_timesteps is None else audio_timesteps.to(noisy.device, dtype)
        mask = text["prompt_attention_mask"].to(noisy.device)
        video, audio_out = denoiser(
            hidden_states=tokens, audio_hidden_states=audio,
            encoder_hidden_states=text["prompt_embeds"].to(noisy.device, dtype),
            audio_encoder_hidden_states=text["audio_prompt_embeds"].to(noisy.device, dtype),
            timestep=t, sigma=t, audio_timestep=audio_t, audio_sigma=audio_t, encoder_attention_mask=mask,
            audio_encoder_attention_mask=mask,
            num_frames=f, height=h, width=w, fps=self.conditioning_fps(cfg), audio_num_frames=audio.shape[1],
            isolate_modalities=isolated, return_dict=False)
        return lat.unpack(video, f // pt, h // p, w // p, p, pt), (None if isolated else audio_out)

    def use_plain_attention(self, model) -> None:
        pass  # LTX-2's attention processor is its own (rotary embeddings inside)

    # ---- sampling and outputs
    def pipeline_class(self):
        from diffusers import LTX2Pipeline
        return LTX2Pipeline

    def pipeline_parts(self, model) -> dict:
        o = model.options
        return {"text_encoder": model.text_encoders[0], "tokenizer": model.tokenizers[0],
                "connectors": o["connectors"], "audio_vae": o["audio_vae"], "vocoder": o["vocoder"]}

    def build_pipeline(self, model, scheduler: str = "euler"):
        pipe = super().build_pipeline(model, scheduler)
        trained = next(unwrap(model.denoiser).parameters())
        for part in ("connectors", "audio_vae", "vocoder"):  # frozen parts join the transformer's device
            getattr(pipe, part).to(trained.device)
        return pipe

    def blocks(self, model) -> list:
        return list(unwrap(model.denoiser).transformer_blocks)

    def comfy_lora(self, adapter_states, alpha):
        from .lora_keys import to_comfy_lora
        return to_comfy_lora(adapter_states, alpha)


LTX2 = LTX2Family()
