"""Wan 2.2 text-to-video (A14B) behind the family contract: two WanTransformer3DModel experts split at
`boundary_ratio` (families/wan/experts.py), flow matching on the normalised latents of the causal 3D
AutoencoderKLWan (8x spatial, 4x temporal: a clip's frame counts are 4k+1), UMT5 text (frozen).

`model.expert` picks what trains: "high" (`transformer`) or "low" (`transformer_2`), each only over
its own timestep range (the other expert stays frozen and joins only the sampling pipeline), or "both"
(both_experts.py: each sample trains the expert of its timestep; one LoRA file per expert). LoRA files are
in diffusers' layout (`transformer.…`; a low-noise expert's file loads with
`WanPipeline.load_lora_weights(file, load_into_transformer_2=True)`) or ComfyUI's (lora_keys.py).
"""
from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ..base import LoadedModel
from ..folder_outputs import FolderOutputs
from ..flow_common import FlowFamily, device_of
from ..objectives import FlowMatchObjective
from .experts import boundary_timestep, timestep_range
from .lora_keys import DEFAULT_TARGETS

DEFAULT_TEXT_LENGTH = 512   # WanPipeline's max_sequence_length


def latent_stats(vae, like):
    """The VAE's per-channel latent mean and std shaped to broadcast over (B, C, F, h, w)."""
    import torch
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=like.device, dtype=like.dtype).view(shape)
    std = torch.tensor(vae.config.latents_std, device=like.device, dtype=like.dtype).view(shape)
    return mean, std



# a frozen expert only samples: a full-size one (57 GB in fp32) waits in host memory in bf16, half of that
FROZEN_EXPERT_BF16_BYTES = 2 * 1024 ** 3


def frozen_expert_in_bf16(folder: Path) -> bool:
    """Whether the expert that does not train loads in bf16: when its weight files hold more than
    FROZEN_EXPERT_BF16_BYTES (Wan 2.2 A14B's 14 B experts; a tiny test model stays fp32, bit for bit)."""
    try:
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    except OSError:
        return False
    return size > FROZEN_EXPERT_BF16_BYTES

class ExpertObjective(FlowMatchObjective):
    """Rectified flow with each sample's timestep mapped into one expert's range [low, high) (within
    loss.timestep_min/max), keeping the sampled distribution's shape inside it."""

    def __init__(self, shift: float, low: float, high: float):
        super().__init__(shift=shift)
        self.low, self.high = low, high

    def timestep(self, generator, latent_shape, loss):
        t = super().timestep(generator, latent_shape, loss)  # in [timestep_min, timestep_max)
        lo, hi = max(self.low, loss.timestep_min), min(self.high, loss.timestep_max)
        if hi <= lo:
            raise ConfigError(f"loss.timestep_min/timestep_max: [{loss.timestep_min}, {loss.timestep_max}) leaves "
                              f"nothing of the expert's range [{self.low:g}, {self.high:g})")
        span = max(loss.timestep_max - loss.timestep_min, 1e-6)
        return lo + (t - loss.timestep_min) / span * (hi - lo)


class Wan22Family(FolderOutputs, FlowFamily):
    name = "wan22_t2v"
    label = "Wan 2.2 T2V"
    short_label = "Wan 2.2"
    text_encoder_names = ("text_encoder",)
    trained_text_encoders = ()        # UMT5-XXL stays frozen (diffusers' Wan LoRA loader reads the transformers)
    text_cache_dtype = "bfloat16"
    full_single_file = None           # a full fine-tune: the diffusers folder
    default_targets = DEFAULT_TARGETS
    keep_unquantized = ("condition_embedder", "patch_embedding", "norm_out", "proj_out", "scale_shift_table")
    block_patterns = ((r"^(?:transformer(?:_2)?\.)?blocks\.(\d+)\.", "block_{0:02d}"),
                      (r"^(?:patch_embedding|condition_embedder|rope)\b", "BASE"), (r"^(?:norm_out|proj_out)\b", "END"))
    base_model_version = "wan_2.2_t2v_14b"
    network_module = "networks.lora_wan"          # musubi-tuner's
    modelspec_architecture = "wan-2.2-t2v-14b"
    modelspec_implementation = "https://github.com/Wan-Video/Wan2.2"
    frame_step = 4
    default_fps = 16.0
    sample_frames = 17
    model_options = ("expert",)

    # ---- detection and loading
    def detect_folder(self, folder: Path, index: dict) -> bool:
        # TI2V-5B is a WanPipeline too, with expand_timesteps (a clean first frame): not this family
        return index.get("_class_name", "") == "WanPipeline" and not index.get("expand_timesteps")

    def detect_file(self, shapes, metadata) -> bool:
        return False  # diffusers folders only (ComfyUI's separate files: not yet)

    def load(self, src: Path, *, vae: str = "", prediction_type: str = "auto", tokenizer: str = "",
             text_encoder_files=None, expert: str = "high") -> LoadedModel:
        import torch
        from ..sd.loader import _first_line
        if prediction_type not in ("auto", "flow"):
            raise ConfigError(f"model.prediction_type: {self.label} predicts the flow; use \"auto\"")
        if not src.is_dir():
            raise ConfigError(f"model.path: {src}: {self.label} loads from a diffusers folder "
                              f"({self.pipeline_class().__name__})")
        if vae:
            raise ConfigError(f"model.vae: does not apply to {self.label} (its folder's VAE is used)")
        try:
            dtypes = {"default": torch.float32}
            other_name = {"high": "transformer_2", "low": "transformer"}.get(expert)
            if other_name and frozen_expert_in_bf16(src / other_name):
                dtypes[other_name] = torch.bfloat16
            pipe = self.pipeline_class().from_pretrained(str(src), local_files_only=True, dtype=dtypes)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
            raise ConfigError(f"model.path: cannot load {src} as a {self.label} model ({_first_line(e)})") from None
        boundary = pipe.config.boundary_ratio
        if pipe.transformer_2 is None or boundary is None:
            if expert != "high":
                raise ConfigError(f"model.expert: {src} has one transformer (no transformer_2): use \"high\"")
        trained, other = ((pipe.transformer_2, pipe.transformer) if expert == "low"
                          else (pipe.transformer, pipe.transformer_2))
        if expert == "both":
            from .both_experts import WanExperts
            trained = WanExperts(pipe.transformer, pipe.transformer_2,
                                 boundary_timestep(boundary, pipe.scheduler.config.num_train_timesteps))
            other = None
        return LoadedModel(family=self, denoiser=trained, vae=pipe.vae, text_encoders=[pipe.text_encoder],
                           tokenizers=[pipe.tokenizer], noise_scheduler=pipe.scheduler, prediction_type="flow",
                           source=str(src), vae_scale_factor=self.spatial_compression(pipe.vae),
                           scheduler_config=dict(pipe.scheduler.config),
                           options={"expert": expert, "other_expert": other, "boundary_ratio": boundary})

    @staticmethod
    def spatial_compression(vae) -> int:
        """Pixels per latent cell along a side: the Wan 2.1 VAE's 8 (its downsampling), the Wan 2.2 VAE's 16
        (downsampling after a 2x2 patchify; its config says scale_factor_spatial)."""
        return getattr(vae.config, "scale_factor_spatial", None) or 2 ** len(vae.config.temperal_downsample)

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny import build_tiny_wan
        return build_tiny_wan(out_dir, seed=seed)

    def meta_denoiser(self):
        from .configs import meta_transformer
        return meta_transformer("t2v-a14b")

    # ---- text
    def t5_length(self, model) -> int:
        """model.t5_max_length, else WanPipeline's 512 (or the tokenizer's own length when shorter: the tiny
        model's 64); at most 1024."""
        own = min(getattr(model.tokenizers[0], "model_max_length", DEFAULT_TEXT_LENGTH), DEFAULT_TEXT_LENGTH)
        return min(model.text_max_length or own, 1024)

    def tokenize(self, model, captions, max_token_length):
        enc = model.tokenizers[0](list(captions), padding="max_length", max_length=self.t5_length(model),
                                  truncation=True, add_special_tokens=True, return_attention_mask=True,
                                  return_tensors="pt")
        return [enc.input_ids, enc.attention_mask]

    def encode_text(self, model, input_ids, encoders=None):
        encoder = (encoders or model.text_encoders)[0]
        ids, mask = (t.to(device_of(encoder)) for t in input_ids)
        hidden = encoder(ids, attention_mask=mask).last_hidden_state
        # as WanPipeline: each caption's states after its last token are zeros
        return {"prompt_embeds": hidden * mask.unsqueeze(-1).to(hidden.dtype)}

    # ---- latents
    def latent_shape(self, model, height, width, frames: int = 1):
        f = model.vae_scale_factor
        return (model.vae.config.z_dim, (frames - 1) // self.frame_step + 1, height // f, width // f)

    def encode_latents(self, model, pixels, eps):
        vae = model.vae
        video = pixels if pixels.ndim == 5 else pixels.unsqueeze(2)   # an image is a 1-frame clip
        dist = vae.encode(video.to(vae.dtype)).latent_dist
        latents = dist.mean if eps is None else dist.mean + dist.std * eps.to(dist.mean)
        latents = latents.float()
        mean, std = latent_stats(vae, latents)
        return (latents - mean) / std

    def decode_latents(self, model, latents):
        vae = model.vae
        mean, std = latent_stats(vae, latents.float())
        return vae.decode((latents.float() * std + mean).to(vae.dtype), return_dict=False)[0].clamp(-1, 1)

    # ---- objective and forward
    def objective(self, model):
        boundary = boundary_timestep(model.options.get("boundary_ratio"),
                                     model.scheduler_config.get("num_train_timesteps", 1000))
        low, high = timestep_range(model.options.get("expert", "high"), boundary)
        return ExpertObjective(shift=model.scheduler_config.get("shift", 1.0) or 1.0, low=low, high=high)

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        hidden = text["prompt_embeds"].to(noisy.device, dtype)
        return denoiser(hidden_states=noisy.to(dtype), timestep=timesteps.to(dtype), encoder_hidden_states=hidden,
                        return_dict=False)[0]

    def use_plain_attention(self, model) -> None:
        pass  # Wan's attention processor is its own (SDPA inside); diffusers' plain AttnProcessor does not fit it

    # ---- sampling and outputs
    def pipeline_class(self):
        from diffusers import WanPipeline
        return WanPipeline

    def build_pipeline(self, model, scheduler: str = "euler"):
        high, low = self.experts(model)
        pipe = self.pipeline_class()(tokenizer=model.tokenizers[0], text_encoder=model.text_encoders[0],
                                     vae=model.vae, scheduler=self.sampling_scheduler(model, scheduler),
                                     transformer=high, transformer_2=low,
                                     boundary_ratio=model.options.get("boundary_ratio"))
        pipe.set_progress_bar_config(disable=True)
        return pipe

    def sampling_scheduler(self, model, scheduler: str = "euler"):
        """samples.scheduler: Euler at the model's shift, or the model's own scheduler ("default")."""
        from diffusers import FlowMatchEulerDiscreteScheduler
        if scheduler not in ("default", "euler"):
            raise ConfigError(f"samples.scheduler: {scheduler!r} does not apply to {self.short_name} "
                              "(use euler or default)")
        config = model.scheduler_config
        if scheduler == "default":  # the model's own (Wan-AI's folders: UniPC with its flow_shift)
            return type(model.noise_scheduler).from_config(config)
        # Euler at the model's shift (a UniPC config names it flow_shift)
        return FlowMatchEulerDiscreteScheduler.from_config(
            config, shift=config.get("flow_shift") or config.get("shift") or 1.0)

    def experts(self, model) -> tuple:
        """(high-noise, low-noise) transformers: the trained one(s) with their adapters, and a frozen other
        expert. In a training run the trainer places that one (sampling_only; model.sampling_placement);
        elsewhere (a tool drawing from a loaded model) it joins the trained one's device and dtype whole."""
        trained, other, expert = model.denoiser, model.options.get("other_expert"), model.options.get("expert")
        if expert == "both":
            trained = getattr(trained, "module", trained)  # DDP
            return trained.transformer, trained.transformer_2
        if other is not None and model.sampling_placement is None:
            other.to(device_of(trained), dtype=next(trained.parameters()).dtype)
        return (other, trained) if expert == "low" else (trained, other)

    def after_sampling(self, model) -> None:
        other = model.options.get("other_expert")
        if other is not None and model.sampling_placement is None:  # back to CPU memory until the next samples
            other.to("cpu")

    def sampling_only(self, model) -> list:
        """The expert that does not train (model.expert high or low) with its 40 blocks: it only samples."""
        other = model.options.get("other_expert")
        return [] if other is None else [(other, list(other.blocks))]

    def blocks(self, model) -> list:
        """The trained expert's blocks (memory.block_swap); both experts': the high-noise one's, then the other's."""
        denoiser = getattr(model.denoiser, "module", model.denoiser)
        if model.options.get("expert") == "both":
            return [*denoiser.transformer.blocks, *denoiser.transformer_2.blocks]
        return list(denoiser.blocks)

    def lora_file_suffixes(self, model) -> tuple[str, ...]:
        from .both_experts import LOW_NOISE_SUFFIX
        return ("", LOW_NOISE_SUFFIX) if model.options.get("expert") == "both" else ("",)

    def lora_file_parts(self, model, adapter_states):
        """Training both experts: the high-noise expert's adapters in the run's file, the low-noise expert's in
        `<name>_low_noise.safetensors` (it loads with load_into_transformer_2=True); each file as one expert's."""
        if model.options.get("expert") != "both":
            return {"": adapter_states}
        from .both_experts import LOW_NOISE_SUFFIX, split_expert_states
        experts = split_expert_states(adapter_states[self.denoiser_name])
        return {"": {self.denoiser_name: experts["transformer"]},
                LOW_NOISE_SUFFIX: {self.denoiser_name: experts["transformer_2"]}}

    def pipeline_parts(self, model) -> dict:
        return {"text_encoder": model.text_encoders[0], "tokenizer": model.tokenizers[0]}

    def comfy_lora(self, adapter_states, alpha):
        from .lora_keys import to_comfy_lora
        return to_comfy_lora(adapter_states, alpha)


WAN22_T2V = Wan22Family()
