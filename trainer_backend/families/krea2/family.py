"""Krea 2 (Raw and Turbo) behind the family contract: a single-stream Krea2Transformer2DModel trained
with rectified flow on 2×2-packed latents of the Qwen-Image autoencoder (AutoencoderKLQwenImage,
normalised per channel), conditioned on a stack of Qwen3-VL hidden states tapped from several layers
(the pipeline's text_encoder_select_layers) of a fixed-length caption block
`[prefix | caption | padding | suffix]` with positions that count only real tokens, as Krea2Pipeline
encodes it. Text tokens sit at the rotary origin, image tokens at their (0, h, w) grid cells.

Raw trains with the pipeline's resolution-dependent shift (up to 6400 packed tokens). Turbo (the
few-step distilled checkpoint: model_index.json's is_distilled) samples with a fixed shift, mu = 1.15,
and trains with that same fixed shift: a LoRA on the distilled weights, learning at the noise levels its
few steps visit, which keeps the distillation's schedule (no de-distilled training adapter is published
for diffusers' Krea 2, docs/models.md).

Editing (dataset.control_path, optional: a folder may mix caption-only images and pairs): the control
images' latents ride along as reference tokens after the target's, at rotary time index 1, 2, … and
modulated at t = 0, as the community's Krea 2 edit LoRA lays them out (references.py); the loss is on the
target's tokens. Samples of an edit run go through Krea2EditPipeline (pipeline.py), which takes `image`."""
from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from ...errors import ConfigError
from ..flow_common import FlowFamily, dynamic_shift, device_of as _device
from ..qwen_image.family import QwenImageFamily, pack, unpack

PIPELINES = ("Krea2Pipeline",)
DEFAULT_TEXT_LENGTH = 512  # the pipeline's max_sequence_length: the fixed caption block
DISTILLED_MU = 1.15        # Krea2Pipeline's fixed timestep shift for the distilled (Turbo) checkpoint


@lru_cache(maxsize=8)
def pipeline_options(source: str) -> dict:
    """The folder's pipeline config (text_encoder_select_layers, is_distilled, patch_size)."""
    index = Path(source) / "model_index.json"
    data = json.loads(index.read_text()) if index.is_file() else {}
    return {k: data[k] for k in ("text_encoder_select_layers", "is_distilled", "patch_size") if k in data}


def options_of(model) -> dict:
    """The pipeline config of a loaded model: its folder's, or (separate files: components.py) the one
    the loader found for them."""
    return model.options["pipeline"] if "pipeline" in model.options else pipeline_options(model.source)


@lru_cache(maxsize=1)
def template() -> tuple[str, str, int, int]:
    """(prefix, suffix, leading tokens dropped, suffix tokens) of the installed Krea2Pipeline."""
    from diffusers import Krea2Pipeline
    pipe = Krea2Pipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=None)
    return (pipe.prompt_template_encode_prefix, pipe.prompt_template_encode_suffix,
            pipe.prompt_template_encode_start_idx, pipe.prompt_template_encode_num_suffix_tokens)


class Krea2Family(FlowFamily):
    name = "krea2"
    label = "Krea 2"
    text_encoder_names = ("text_encoder",)
    trained_text_encoders = ()  # diffusers' Krea 2 LoRA loader reads the transformer only
    full_single_file = "denoiser"  # the transformer in the original layout (single_file.py) + a diffusers folder
    transformer_file_module = ".krea2.single_file"
    text_encoder_file_options = ("text_encoder",)
    component_files_loader = ".krea2.components:load_krea2_files"  # ComfyUI's separate files
    text_cache_dtype = "bfloat16"
    control_images = "optional"   # pairs train editing, caption-only images text-to-image, in one run
    control_image_argument = "image"
    max_control_images = 3        # as the community edit LoRA's trainer and ComfyUI nodes take
    text_reads_control = True     # Qwen3-VL reads a pair's references before its caption (text.py)
    # every block's attention (with its output gate) and SwiGLU MLP (the text-fusion blocks' too: same names)
    default_targets = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_gate", "attn.to_out.0", "ff.gate", "ff.up",
                       "ff.down")
    keep_unquantized = ("time_embed", "time_mod_proj", "txt_in", "text_fusion", "img_in", "final_layer")
    block_patterns = ((r"^transformer_blocks\.(\d+)\.", "block_{0:02d}"),
                      (r"^(?:img_in|txt_in|text_fusion|time_embed|time_mod_proj)\b", "BASE"),
                      (r"^final_layer\b", "END"))
    base_model_version = "krea2"
    network_module = "networks.lora_krea2"
    modelspec_implementation = "https://www.krea.ai"
    modelspec_architecture = "krea-2"

    def detect_folder(self, folder: Path, index: dict) -> bool:
        return index.get("_class_name", "") in PIPELINES

    def detect_file(self, shapes, metadata) -> bool:
        """The original layout's transformer (the key diffusers' single-file loader detects it by)."""
        return any(k.endswith("txtfusion.projector.weight") for k in shapes)

    def load_folder(self, src: Path, *, vae: str = "", prediction_type: str = "auto"):
        import torch
        from ..sd.loader import _first_line
        if prediction_type not in ("auto", "flow"):
            raise ConfigError(f"model.prediction_type: {self.label} predicts the flow (noise − image); "
                              f"{prediction_type!r} does not apply (use \"auto\")")
        try:
            pipe = self.pipeline_class().from_pretrained(str(src), local_files_only=True, dtype=torch.float32)
        except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError) as e:
            raise ConfigError(f"model.path: cannot load {src} as a {self.label} model ({_first_line(e)})") from None
        if vae:
            from ..qwen_image.single_file import load_vae
            pipe.vae = load_vae(vae)
        return QwenImageFamily.loaded(self, src, pipe.transformer, pipe.vae, pipe.text_encoder, pipe.tokenizer,
                                      dict(pipe.scheduler.config))

    def build_tiny(self, out_dir, seed: int = 0, variant: str = "", **options) -> Path:
        from .tiny import build_tiny_krea2
        return build_tiny_krea2(out_dir, seed=seed, distilled=variant == "turbo")

    def meta_denoiser(self):
        import torch
        from diffusers import Krea2Transformer2DModel
        from ..component_files import bundled
        with torch.device("meta"):
            return Krea2Transformer2DModel.from_config(bundled("krea2", "transformer/config.json"))

    def select_layers(self, model) -> tuple[int, ...]:
        """The tapped text-encoder layers: the folder's, else (or where they do not fit the transformer, as
        for the memory planner's full-size model) Krea2Pipeline's own default for Krea 2's Qwen3-VL 4B."""
        layers = options_of(model).get("text_encoder_select_layers")
        if layers is None or len(layers) != model.denoiser.config.num_text_layers:
            from diffusers import Krea2Pipeline
            layers = Krea2Pipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None,
                                   transformer=None).text_encoder_select_layers
        return tuple(layers)

    def distilled(self, model) -> bool:
        return bool(options_of(model).get("is_distilled", False))

    def base_model_version_of(self, model) -> str:
        return "krea2_turbo" if self.distilled(model) else "krea2_raw"

    def architecture(self, model) -> str:
        return "krea-2-turbo" if self.distilled(model) else "krea-2-raw"

    # ---- text
    def t5_length(self, model) -> int:
        return model.text_max_length or DEFAULT_TEXT_LENGTH

    def tokenize(self, model, captions, max_token_length, controls=None):
        """The pipeline's fixed block: [prefix | caption | padding to length | suffix]; with `controls` (an edit
        pair's references: [B, 3·N, H, W] pixels in [-1, 1], or per caption a list of PIL images) the
        references' vision tokens before each caption (text.py)."""
        import torch
        if controls is not None:
            from ...data.pairs import per_reference
            from ..qwen_image.text import to_pil
            from .text import tokenize as with_references
            vision_tower_loaded(model.text_encoders[0])
            if not isinstance(controls, list):
                images = to_pil(per_reference(controls, 3))
                n = len(images) // len(captions)
                controls = [images[i * n:(i + 1) * n] for i in range(len(captions))]
            return with_references(model.tokenizers[0], list(captions), controls, template())
        prefix, suffix, start, n_suffix = template()
        tok = model.tokenizers[0]
        text = tok([prefix + c for c in captions], truncation=True, padding="max_length",
                   max_length=self.t5_length(model) + start - n_suffix, return_tensors="pt")
        tail = tok([suffix] * len(captions), return_tensors="pt")
        return [torch.cat([text.input_ids, tail.input_ids], dim=1),
                torch.cat([text.attention_mask, tail.attention_mask], dim=1)]

    def tokenize_batch(self, model, batch, max_token_length):
        """A pair's caption with its references (decoded from their latents when those are cached)."""
        from ..qwen_image.family import pair_reference_pixels
        return self.tokenize(model, list(batch["caption"]), max_token_length,
                             controls=pair_reference_pixels(self, model, batch))

    def encode_text(self, model, input_ids, encoders=None):
        import torch
        encoder = (encoders or model.text_encoders)[0]
        if len(input_ids) > 2:  # an edit pair: its references' vision tokens before the caption
            from .text import encode
            return encode(encoder, input_ids, self.select_layers(model), template()[2])
        encoder = getattr(encoder, "module", encoder)  # DDP
        ids, mask = (t.to(_device(encoder)) for t in input_ids)
        mask = mask.bool()
        # positions count only real tokens (the padding sits before the suffix), on all three mRoPE axes
        positions = (mask.long().cumsum(dim=-1) - 1).clamp(min=0).unsqueeze(0).expand(3, -1, -1)
        out = encoder(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)
        layers = self.select_layers(model)
        hidden = torch.stack([out.hidden_states[i] for i in layers], dim=2)
        start = template()[2]
        return {"hidden": hidden[:, start:], "mask": mask[:, start:]}

    # ---- latents: the Qwen-Image autoencoder, as Qwen-Image encodes them
    latent_shape = QwenImageFamily.latent_shape
    encode_latents = QwenImageFamily.encode_latents
    decode_latents = QwenImageFamily.decode_latents

    # ---- objective and forward
    def objective(self, model):
        from ..objectives import FlowMatchObjective
        if self.distilled(model):  # Turbo: the fixed shift its few sampling steps use
            return FlowMatchObjective(shift=math.exp(DISTILLED_MU))
        c = model.scheduler_config
        return FlowMatchObjective(shift=c.get("shift", 1.0), dynamic_shift=dynamic_shift(c, max_seq_len=6400))

    def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
        import contextlib
        from diffusers import Krea2Pipeline
        from ...data.pairs import per_reference
        from .references import attached, pack_references
        b, c, h, w = noisy.shape
        hidden, mask = text["hidden"].to(noisy.device), text["mask"].to(noisy.device).bool()
        positions = Krea2Pipeline.prepare_position_ids(hidden.shape[1], h // 2, w // 2, noisy.device)
        control = batch.get("control_latents")
        references = contextlib.nullcontext()
        if control is not None:  # an edit pair: its references (one after another along the channels) ride along
            refs = per_reference(control.to(noisy.device), c).unflatten(0, (b, -1)).unbind(1)
            references = attached(denoiser, *pack_references(list(refs), noisy.device, dtype))
        with references:  # the output is the target's tokens only
            out = denoiser(hidden_states=pack(noisy).to(dtype), encoder_hidden_states=hidden.to(dtype),
                           timestep=(timesteps / 1000).to(dtype), position_ids=positions,
                           encoder_attention_mask=mask, return_dict=False)[0]
        return unpack(out, c, h, w)

    # ---- sampling and outputs
    def pipeline_class(self):
        from diffusers import Krea2Pipeline
        return Krea2Pipeline

    def model_pipeline_class(self, model):
        """Samples: Krea2Pipeline that also takes reference images (an edit run's `--control`)."""
        from .pipeline import Krea2EditPipeline
        return Krea2EditPipeline

    def save_pipeline_folder(self, model, folder: Path) -> None:
        # a plain Krea2Pipeline folder (model_index.json names it: diffusers and detect_folder load it)
        from diffusers import FlowMatchEulerDiscreteScheduler
        pipe = self.pipeline_class()(scheduler=FlowMatchEulerDiscreteScheduler.from_config(model.scheduler_config),
                                     vae=model.vae, transformer=model.denoiser, **self.pipeline_parts(model))
        pipe.save_pretrained(str(folder), safe_serialization=True)

    def pipeline_parts(self, model) -> dict:
        opts = options_of(model)
        return {"text_encoder": model.text_encoders[0], "tokenizer": model.tokenizers[0],
                **{k: v for k, v in opts.items() if k in ("text_encoder_select_layers", "is_distilled")}}

    def lora_file_state(self, model, adapter_states, alpha, layout="auto"):
        state = super().lora_file_state(model, adapter_states, alpha, "diffusers")
        if self.lora_layout(layout) == "original":
            from .lora_keys import to_original
            return to_original(state)
        return state

    def guidance_arguments(self, model, scale):
        # Krea2Pipeline: cond + g·(cond − uncond), off at g = 0; samples.cfg_scale s is the usual s (1 = off)
        return {"guidance_scale": max(scale - 1.0, 0.0)}

    def export_single_file(self, model, single_file, dtype, metadata) -> Path:
        from ..sd.single_file import META_ARCH
        return super().export_single_file(model, single_file, dtype, {**(metadata or {}), META_ARCH: self.name})


def vision_tower_loaded(encoder) -> None:
    """An edit pair's caption is read with its references by Qwen3-VL's vision tower: a text encoder file without
    one (ComfyUI's separate files may hold the language model alone: components.py loads zeros) is refused."""
    weight = getattr(encoder, "module", encoder).visual.patch_embed.proj.weight
    if weight.device.type != "meta" and not bool(weight.detach().any()):
        raise ConfigError("dataset.control_path: Krea 2 edit pairs are read by Qwen3-VL's vision tower, and the text "
                          "encoder loaded holds none (model.text_encoder's file has no visual.* weights): give a "
                          "Qwen3-VL-4B file with its vision tower, or a Krea 2 diffusers folder")


KREA2 = Krea2Family()
