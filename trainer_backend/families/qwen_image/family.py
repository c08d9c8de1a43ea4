"""Qwen-Image and Qwen-Image-Edit behind the family contract: a QwenImageTransformer2DModel trained
with rectified flow on 2×2-packed latents of its own 3D causal autoencoder (AutoencoderKLQwenImage,
normalised per channel by latents_mean/std), conditioned on Qwen2.5-VL hidden states with a mask
(text.py), positions from img_shapes, and Qwen-Image's resolution-dependent shift. The edit model
appends the control image's packed latents to the image tokens (a second entry in img_shapes) and
its text encoder reads the control image too."""
from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ..base import LoadedModel
from ..flow_common import FlowFamily, dynamic_shift, device_of as _device
from . import text as qtext

PIPELINES = ("QwenImagePipeline", "QwenImageImg2ImgPipeline", "QwenImageInpaintPipeline")
EDIT_PIPELINES = ("QwenImageEditPipeline", "QwenImageEditInpaintPipeline")
DEFAULT_TEXT_LENGTH = 512  # the pipelines' max_sequence_length (at most 1024)


def pack(latents):
    b, c, h, w = latents.shape
    return latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens, c: int, h: int, w: int):
    b = tokens.shape[0]
    return tokens.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def latent_stats(vae, like):
    """The autoencoder's per-channel latent mean and std (Qwen-Image's VAE, also Qwen-Image 2.1's), shaped to
    broadcast over `like`'s [B, C, H, W], on its device and dtype."""
    import torch
    shape = (1, vae.config.z_dim, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=like.device, dtype=like.dtype).view(shape)
    std = torch.tensor(vae.config.latents_std, device=like.device, dtype=like.dtype).view(shape)
    return mean, std


def pair_reference_pixels(family, model, batch):
    """A pair batch's reference images for a text encoder that reads them (Qwen-Image-Edit-Plus, Krea 2 edit):
    its control pixels, or each reference decoded back from its cached latents; None for caption-only batches."""
    import torch
    from ...data.pairs import joined_references, per_reference
    controls = batch.get("control_pixel_values")
    if controls is None and batch.get("control_latents") is not None:
        latents = batch["control_latents"]
        with torch.no_grad():
            pixels = family.decode_latents(model, per_reference(latents, model.vae.config.z_dim).to(
                _device(model.vae)))
        controls = joined_references(pixels, latents.shape[0])
    return controls


class QwenImageFamily(FlowFamily):
    name = "qwen_image"
    label = "Qwen-Image"
    text_encoder_names = ("text_encoder",)
    # Qwen2.5-VL 7B stays frozen: diffusers' Qwen-Image LoRA loader reads the transformer only
    trained_text_encoders = ()
    full_single_file = "denoiser"
    text_cache_dtype = "bfloat16"  # Qwen2.5-VL hidden states: 3584 wide; bf16 keeps their range
    # both streams' attention and both streams' MLPs in every block
    default_targets = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                       "net.0.proj", "net.2")
    default_text_encoder_targets = ("q_proj", "k_proj", "v_proj", "o_proj")
    text_encoder_file_options = ("text_encoder",)
    # model.quantize: the embeddings in and out of the token streams stay in full precision
    keep_unquantized = ("time_text_embed", "img_in", "txt_in", "norm_out", "proj_out")
    block_patterns = ((r"^transformer_blocks\.(\d+)\.", "block_{0:02d}"),
                      (r"^(?:img_in|txt_in|txt_norm|time_text_embed)\b", "BASE"), (r"^(?:norm_out|proj_out)\b", "END"))
    base_model_version = "qwen_image"
    network_module = "networks.lora_qwen_image"   # musubi-tuner's
    modelspec_implementation = "https://github.com/QwenLM/Qwen-Image"
    modelspec_architecture = "qwen-image"
    transformer_file_module = ".qwen_image.single_file"
    edit = False
    pipelines = PIPELINES

    # ---- detection and loading
    def detect_folder(self, folder: Path, index: dict) -> bool:
        return index.get("_class_name", "") in self.pipelines

    def detect_file(self, shapes, metadata) -> bool:
        from .single_file import is_transformer_file
        # the edit model's transformer file looks like Qwen-Image's: auto detection picks Qwen-Image
        # (registered first), model.arch = qwen_image_edit picks the edit model (families.load_model)
        return is_transformer_file(shapes)

    def load(self, src: Path, *, vae: str = "", prediction_type: str = "auto", tokenizer: str = "",
             text_encoder_files: dict[str, str] | None = None) -> LoadedModel:
        import torch
        from ..sd.loader import _first_line
        if prediction_type not in ("auto", "flow"):
            raise ConfigError(f"model.prediction_type: {self.label} predicts the flow (noise − image); "
                              f"{prediction_type!r} does not apply (use \"auto\")")
        if not src.is_dir():
            from .single_file import load_qwen_files
            return load_qwen_files(self, src, vae=vae, tokenizer=tokenizer, files=text_encoder_files or {})
        if text_encoder_files:
            raise ConfigError(f"model.{next(iter(text_encoder_files))}: applies to a {self.label} single file; "
                              f"{src} is a diffusers folder with its own text encoder")
        try:
            extra = {"processor": qtext.load_processor(src / "processor")} if self.edit else {}
            pipe = self.pipeline_class().from_pretrained(str(src), local_files_only=True, dtype=torch.float32, **extra)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError) as e:
            raise ConfigError(f"model.path: cannot load {src} as a {self.label} model ({_first_line(e)})") from None
        if vae:
            from .single_file import load_vae
            pipe.vae = load_vae(vae)
        return self.loaded(src, pipe.transformer, pipe.vae, pipe.text_encoder,
                           pipe.processor if self.edit else pipe.tokenizer, dict(pipe.scheduler.config))

    def loaded(self, src, transformer, vae, text_encoder, tokenizer, scheduler_config: dict) -> LoadedModel:
        from diffusers import FlowMatchEulerDiscreteScheduler
        return LoadedModel(family=self, denoiser=transformer, vae=vae, text_encoders=[text_encoder],
                           tokenizers=[tokenizer], noise_scheduler=FlowMatchEulerDiscreteScheduler.from_config(
                               scheduler_config), prediction_type="flow", source=str(src),
                           vae_scale_factor=2 ** len(vae.temperal_downsample), scheduler_config=scheduler_config)

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny import build_tiny_qwen_image
        return build_tiny_qwen_image(out_dir, seed=seed, edit=self.edit)

    def meta_denoiser(self):
        import torch
        from diffusers import QwenImageTransformer2DModel
        from .single_file import bundled
        with torch.device("meta"):
            return QwenImageTransformer2DModel.from_config(bundled("transformer/config.json"))

    # ---- text
    def t5_length(self, model) -> int:
        """model.t5_max_length (the pipelines' max_sequence_length), else 512; at most 1024."""
        return min(model.text_max_length or DEFAULT_TEXT_LENGTH, 1024)

    def tokenize(self, model, captions, max_token_length):
        return qtext.tokenize(model.tokenizers[0], list(captions), self.edit)

    def encode_text(self, model, input_ids, encoders=None):
        encoder = (encoders or model.text_encoders)[0]
        inputs = [t.to(_device(encoder)) for t in input_ids]
        return qtext.encode(encoder, inputs, self.edit, None if self.edit else self.t5_length(model))

    # ---- latents
    def latent_shape(self, model, height, width):
        f = model.vae_scale_factor
        return (model.vae.config.z_dim, height // f, width // f)

    def encode_latents(self, model, pixels, eps):
        vae = model.vae
        dist = vae.encode(pixels.to(vae.dtype).unsqueeze(2)).latent_dist
        latents = dist.mean if eps is None else dist.mean + dist.std * eps.unsqueeze(2).to(dist.mean)
        latents = latents[:, :, 0].float()
        mean, std = latent_stats(vae, latents)
        return (latents - mean) / std

    def decode_latents(self, model, latents):
        """Training latents -> pixels in [-1, 1] (the inverse of encode_latents, as the pipelines decode)."""
        vae = model.vae
        mean, std = latent_stats(vae, latents.float())
        raw = (latents.float() * std + mean).to(vae.dtype).unsqueeze(2)
        return vae.decode(raw, return_dict=False)[0][:, :, 0].clamp(-1, 1)

    # ---- objective and forward
    def objective(self, model):
        from ..objectives import FlowMatchObjective
        c = model.scheduler_config
        return FlowMatchObjective(shift=c.get("shift", 1.0),
                                  dynamic_shift=dynamic_shift(c, max_seq_len=8192, max_shift=0.9))

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        b, c, h, w = noisy.shape
        tokens = pack(noisy)
        shapes = [(1, h // 2, w // 2)]
        if self.edit:  # each reference's packed latents after the target's, with its own img_shapes entry
            import torch
            from ...data.pairs import per_reference
            control = batch["control_latents"].to(noisy.device, noisy.dtype)
            references = per_reference(control, c).unflatten(0, (b, -1)).unbind(1)
            tokens = torch.cat([tokens, *(pack(r) for r in references)], dim=1)
            shapes += [(1, control.shape[-2] // 2, control.shape[-1] // 2)] * len(references)
        host_mask = batch.get("text", text)["mask"]  # cached text: the loader's host copy (no wait for the GPU)
        used = int(host_mask.sum(dim=1).max())  # padding after the longest caption of the batch: cut
        hidden, mask = text["hidden"].to(noisy.device), text["mask"].to(noisy.device).long()
        hidden, mask = hidden[:, :used], mask[:, :used]
        out = denoiser(hidden_states=tokens.to(dtype), timestep=(timesteps / 1000).to(dtype),
                       encoder_hidden_states=hidden.to(dtype), encoder_hidden_states_mask=mask,
                       img_shapes=[shapes] * b, return_dict=False)[0]
        return unpack(out[:, :(h // 2) * (w // 2)], c, h, w)

    # ---- sampling and outputs
    def pipeline_class(self):
        from diffusers import QwenImagePipeline
        return QwenImagePipeline

    def pipeline_parts(self, model) -> dict:
        tok = model.tokenizers[0]  # the edit model's: its processor, which holds the tokenizer
        extra = {"processor": tok, "tokenizer": tok.tokenizer} if self.edit else {"tokenizer": tok}
        return {"text_encoder": model.text_encoders[0], **extra}

    def guidance_arguments(self, model, scale):
        # true classifier-free guidance (a second pass with the negative prompt; none without one)
        return {"true_cfg_scale": scale}

    def lora_file_state(self, model, adapter_states, alpha, layout="auto"):
        if self.lora_layout(layout) == "kohya":
            from .lora_keys import to_comfy_lora
            return to_comfy_lora(adapter_states, alpha)
        return super().lora_file_state(model, adapter_states, alpha, layout)

    def export_single_file(self, model, single_file, dtype, metadata) -> Path:
        from ..sd.single_file import META_ARCH
        stamped = {**(metadata or {}), META_ARCH: self.name}  # the family, which the keys cannot tell
        return super().export_single_file(model, single_file, dtype, stamped)

    def save_pipeline_folder(self, model, folder: Path) -> None:
        if not self.edit:
            return super().save_pipeline_folder(model, folder)
        # diffusers cannot save the processor without torchvision: text.py writes it
        pipe = self.build_pipeline(model, "default")
        processor = pipe.processor
        pipe.register_modules(processor=None)
        pipe.save_pretrained(str(folder), safe_serialization=True)
        qtext.save_processor(processor, folder / "processor", folder / "model_index.json")


class QwenImageEditFamily(QwenImageFamily):
    name = "qwen_image_edit"
    label = "Qwen-Image-Edit"
    base_model_version = "qwen_image_edit"
    modelspec_architecture = "qwen-image-edit"
    edit = True
    pipelines = EDIT_PIPELINES
    control_images = "required"
    control_image_argument = "image"
    text_reads_control = True  # the VL encoder reads the control image: no per-caption text cache

    def pipeline_class(self):
        from diffusers import QwenImageEditPipeline
        return QwenImageEditPipeline

    def tokenize(self, model, captions, max_token_length, controls=None):
        if controls is None:
            raise ConfigError(f"{self.label}: its text encoder reads each caption with its control image "
                              "(dataset.control_path)")
        return qtext.tokenize(model.tokenizers[0], list(captions), True, qtext.to_pil(controls))

    def probe_tokens(self, model, captions):
        """The caption alone through the edit template's text (no vision tokens): the vision tower's token
        count comes from the image's values, which the meta device does not have. The memory planner's
        text-encoder pass for the edit model therefore leaves out the control image's vision tokens."""
        template, drop = qtext.prompt_template(True)
        enc = model.tokenizers[0].tokenizer([template.format(c) for c in captions], max_length=1024 + drop,
                                            padding=True, truncation=True, return_tensors="pt")
        return [enc.input_ids, enc.attention_mask]

    def tokenize_batch(self, model, batch, max_token_length):
        import torch
        controls = batch.get("control_pixel_values")
        if controls is None:  # cached latents: the control image back from its latent
            latents = batch["control_latents"]
            with torch.no_grad():
                controls = self.decode_latents(model, latents.to(_device(model.vae)))
        return self.tokenize(model, list(batch["caption"]), max_token_length, controls=controls)


QWEN_IMAGE = QwenImageFamily()
QWEN_IMAGE_EDIT = QwenImageEditFamily()
