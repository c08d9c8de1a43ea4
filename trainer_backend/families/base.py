"""The model-family contract: what a family (SD1, SD2, SDXL, and the flow-matching
transformers after them) provides, so the loop, data, checkpoints, plan, GUI and export never
ask which family a model is.

A family is one folder under `families/` with one `Family` subclass instance per registered
name (`families/registry.py`). The loop holds a `LoadedModel` and asks `model.family` for
everything family-specific: text encoding, latents, the objective, the forward call with its
extra conditioning, the sampling pipeline, and the output files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # typing only: importing this module needs no torch
    import torch

    from .objectives import Objective


@dataclass
class LoadedModel:
    """A base model's modules in fp32, as its family loaded them. Precision, devices and what is
    trainable are the training method's business; `family` knows what the modules mean."""
    family: "Family | None"   # None only for a VAE run's autoencoder-alone model
    denoiser: Any             # the trained network: UNet2DConditionModel, or a transformer
    vae: Any                  # the autoencoder
    text_encoders: list       # in the family's text_encoder_names order
    tokenizers: list          # same length
    noise_scheduler: Any      # the training scheduler (DDPM for SD; flow matching later)
    prediction_type: str      # "epsilon" | "v_prediction" | "flow"
    source: str               # resolved path of the base model
    vae_scale_factor: int     # pixels per latent cell along one side
    scheduler_config: dict = field(default_factory=dict)  # the model's own (inference) scheduler config
    text_max_length: int = 0  # model.t5_max_length: tokens per caption for T5-style encoders; 0 = the model's own
    clip_skip: int = 1        # model.clip_skip: the CLIP layer counted from the end (families that apply it)
    denoiser_placed: bool = False  # training/setup.place_denoiser ran (after the cache pass)
    options: dict = field(default_factory=dict)  # the family's own load options (Family.model_options) and parts
    # the trainer's placement of the sampling-only modules (Family.sampling_only) around samples: a context
    # manager factory (training/sampling_residency.py); None: build_pipeline brings them itself
    sampling_placement: Callable[[], Any] | None = None

    @property
    def arch(self) -> str:
        """The family's registered name (the `model.arch` value)."""
        return self.family.name if self.family is not None else ""

    @property
    def unet(self):
        """The denoiser under the name diffusers' UNet pipelines use."""
        return self.denoiser

    def trained_text_encoders(self) -> list[tuple[str, Any]]:
        """(name, module) of the text encoders network.train_text_encoder trains."""
        if self.family is None:
            return []
        names = self.family.trainable_text_encoders()
        return [(n, te) for n, te in zip(self.family.text_encoder_names, self.text_encoders) if n in names]

    def components(self) -> dict[str, Any]:
        """Pipeline component name -> module, for every trainable-or-frozen part."""
        return {self.family.denoiser_name: self.denoiser, "vae": self.vae,
                **dict(zip(self.family.text_encoder_names, self.text_encoders))}


class Family:
    """One model family. Subclasses set the attributes and implement the methods; every method
    takes the `LoadedModel` it concerns, so one Family instance serves every model of the family."""

    name: str = ""                              # registered name, the `model.arch` value
    label: str = ""                             # human name
    denoiser_name: str = "unet"                 # pipeline component name of the trained network
    text_encoder_names: tuple[str, ...] = ("text_encoder",)
    # the text encoders network.train_text_encoder trains (T5 stays frozen in the Flux/SD3 families);
    # () = none (keep the registry entry's text_encoder_training False then)
    trained_text_encoders: tuple[str, ...] | None = None  # None: all of text_encoder_names
    # a full fine-tune's single file: the whole model ("whole", SD checkpoints), the denoiser alone
    # ("denoiser", Flux, as ComfyUI keeps it), or none (None: the diffusers folder only)
    full_single_file: str | None = "whole"
    # the text-encoder output cache's dtype: T5 outputs are large, and fp16 halves them
    text_cache_dtype: str = "float32"
    # adapters: peft target module names on the denoiser and on the text encoders
    default_targets: tuple[str, ...] = ()
    default_text_encoder_targets: tuple[str, ...] = ()
    # model.<option> names of separate text-encoder files a single-file model loads with (Flux: clip_l, t5)
    text_encoder_file_options: tuple[str, ...] = ()
    # metadata stamped into outputs, as kohya's sd-scripts / musubi-tuner write it for this family (tools
    # such as SwarmUI and kohya's merge scripts classify files by it): ss_base_model_version (a variant's,
    # base_model_version_of), the kohya network module that reads the family's LoRA files, and the SAI
    # modelspec's architecture (architecture()) and implementation
    base_model_version: str = ""
    modelspec_architecture: str = ""
    network_module: str = "networks.lora"
    modelspec_implementation: str = "diffusers"
    # paired control (reference) images, one per training image (dataset.control_path, docs/dataset.md):
    # "" = not used (a control_path is refused), "optional", "required" (an edit model: refused without
    # one). Keep it equal to the registry entry's `control_images` (the config rules read that, torch-free).
    # Training batches then hold `control_latents` [B, C, h, w] (the control image through the same
    # bucket resize, crop and flip as the target, encoded by encode_latents with eps=None); `predict`
    # reads them from its `batch`. Samples pass each prompt's `--control` image to the pipeline under
    # `control_image_argument`.
    control_images: str = ""
    control_image_argument: str = "image"
    # the sampling pipeline starts from an image (image-to-video) without training on paired images: a sample
    # prompt's `--control` gives it (as control_image_argument), else the family's pipeline_call_options does
    takes_start_image: bool = False
    # reference images per training image at most (docs/dataset.md's numbered control names): above 1,
    # `control_pixel_values` / `control_latents` hold the references one after another along the
    # channels ([B, N·C, h, w], data/pairs.py per_reference splits them) and each sample prompt may
    # repeat `--control` (the pipeline then gets a list of images). Equal to the registry entry's.
    max_control_images: int = 1
    # the text encoder reads the control image too (an edit model's vision-language encoder): text is
    # tokenized per batch with its control images (tokenize_batch) and never cached per caption
    text_reads_control: bool = False
    # video families (docs/video.md): clip frame counts are k * frame_step + 1 and the VAE compresses time by
    # frame_step (Wan 4, LTX-2 8); 0 = an image family. Equal to the registry entry's. A video family's
    # latent_shape takes `frames=`, encode_latents takes (B, 3, H, W) images (1-frame clips) and (B, 3, F, H, W)
    # clips and returns 5D latents; its pipeline takes `num_frames` (samples are mp4 + a frame strip)
    frame_step: int = 0
    default_fps: float = 16.0     # the sample clips' frame rate
    sample_frames: int = 17       # a sample prompt's frames without `--f`
    # [model] fields passed to `load` as keyword arguments (model.<name>) and kept on LoadedModel.options
    model_options: tuple[str, ...] = ()
    # the model generates audio beside the video (LTX-2): a clip window with an audio track trains both streams
    # (data/audio.py decodes it; `audio_format`, `encode_audio`, `predict_audio_video`); equal to the registry's
    audio_stream: bool = False

    def clip_audio(self, clips_with_audio: int, clips: int = 0, trained: int = 0) -> str:
        """What a video run does with its clips' audio tracks, as the plan says it (the scan summary's
        video "audio"): `clips` clips, `clips_with_audio` with an audio track, `trained` of them training it.
        A model without an audio stream ignores them."""
        return "ignored (the model has no audio stream)"

    def audio_format(self, model: LoadedModel) -> tuple[int, int]:
        """An audio-stream family: (sample rate, channels) its audio encoder takes."""
        raise NotImplementedError

    def encode_audio(self, model: LoadedModel, waveform: "torch.Tensor") -> "torch.Tensor":
        """An audio-stream family: waveforms (B, channels, samples) at audio_format's rate -> the audio latents
        the denoiser takes and predicts, batch first (cached per clip window like the video latents)."""
        raise NotImplementedError

    def predict_audio_video(self, model: LoadedModel, denoiser, noisy: "torch.Tensor", noisy_audio: "torch.Tensor",
                            timesteps: "torch.Tensor", text: dict, batch: dict, dtype, cfg=None,
                            audio_timesteps: "torch.Tensor | None" = None) -> tuple:
        """An audio-stream family: `predict` with both streams, (video prediction, audio prediction);
        `audio_timesteps`: the audio's own (loss.audio_timestep), else the video's."""
        raise NotImplementedError

    def trainable_text_encoders(self) -> tuple[str, ...]:
        """The text encoders network.train_text_encoder trains (none when the family keeps them frozen)."""
        return self.text_encoder_names if self.trained_text_encoders is None else self.trained_text_encoders
    # model.quantize(_text_encoders): linear layers that stay in full precision (small, sensitive ones:
    # timestep/conditioning embeddings, the final projection). A name matches when it equals a part of
    # the layer's dotted path or globs the whole path (compute/quantize.py); the model classes'
    # own `_keep_in_fp32_modules` are kept too.
    keep_unquantized: tuple[str, ...] = ()

    # ---- detection and loading
    def detect_folder(self, folder: Path, index: dict) -> bool:
        """True when the diffusers folder (its model_index.json given as `index`) is this family."""
        raise NotImplementedError

    def detect_file(self, shapes: dict[str, tuple[int, ...]], metadata: dict[str, str]) -> bool:
        """True when a single file (weight names -> shapes, and its metadata) is this family."""
        raise NotImplementedError

    def load(self, src: Path, *, vae: str = "", prediction_type: str = "auto", tokenizer: str = "",
             text_encoder_files: dict[str, str] | None = None) -> LoadedModel:
        """Load a detected model in fp32 (errors: ConfigError naming model.*). text_encoder_files:
        model.<option> -> path, for the options in text_encoder_file_options (only those are passed)."""
        raise NotImplementedError

    def build_tiny(self, out_dir: str | Path, seed: int = 0, **options) -> Path:
        """A tiny random model of this family as a diffusers folder (tests, the demo)."""
        raise NotImplementedError

    def hub_files(self, files: list[str], index: dict) -> list[str]:
        """Of a hub repo's files (a pipeline repo: its model_index.json is `index`), those `load` reads:
        by default each listed component's folder with one weight variant and format (families/hub_files.py)."""
        from .hub_files import pipeline_files
        return pipeline_files(files, index)

    def meta_denoiser(self):
        """The full-size denoiser built on the meta device (no weights): key-set checks."""
        raise NotImplementedError

    # ---- text and latents
    def tokenize(self, model: LoadedModel, captions: list[str], max_token_length: int) -> list["torch.Tensor"]:
        raise NotImplementedError

    def probe_tokens(self, model: LoadedModel, captions: list[str]) -> list["torch.Tensor"]:
        """The text-encoder inputs the memory probe (training/memory_probe.py) runs on the meta device:
        the captions alone (a family whose text encoder also reads an image says what it can measure)."""
        return self.tokenize(model, captions, 75)

    def tokenize_batch(self, model: LoadedModel, batch: dict, max_token_length: int) -> list["torch.Tensor"]:
        """A training batch's text-encoder inputs: its captions (and, where text_reads_control, its
        control images: `control_pixel_values`, or `control_latents` when latents are cached)."""
        return self.tokenize(model, list(batch["caption"]), max_token_length)

    def encode_text(self, model: LoadedModel, input_ids: list["torch.Tensor"],
                    encoders: list | None = None) -> dict[str, "torch.Tensor"]:
        """The denoiser's text conditioning as named tensors (what the text cache stores).
        `encoders` replaces model.text_encoders (e.g. DDP-wrapped ones being trained)."""
        raise NotImplementedError

    def latent_shape(self, model: LoadedModel, height: int, width: int) -> tuple[int, ...]:
        f = model.vae_scale_factor
        return (model.vae.config.latent_channels, height // f, width // f)

    def encode_latents(self, model: LoadedModel, pixels: "torch.Tensor", eps: "torch.Tensor | None") -> "torch.Tensor":
        """Pixels in [-1, 1] -> the latents the denoiser trains on (scaled and shifted).
        eps: the posterior sample's noise (None: the posterior mean)."""
        from .objectives import encode_with_vae
        cfg = model.vae.config
        return encode_with_vae(model.vae, pixels, eps, cfg.scaling_factor, getattr(cfg, "shift_factor", None) or 0.0)

    def pixel_conditions(self, model: LoadedModel, pixels: "torch.Tensor") -> dict[str, "torch.Tensor"]:
        """Conditioning a step builds from the batch's pixels besides the latents (Wan I2V: the first frame's
        VAE condition), batch first; with dataset.cache_latents it is computed with the latents, stored beside
        them and served as `batch["conditions"][name]`, so a cached step runs no VAE. `predict` uses it when
        present. Names in `pixel_condition_names`."""
        return {}

    pixel_condition_names: tuple[str, ...] = ()

    # ---- the objective and the forward call
    def objective(self, model: LoadedModel) -> "Objective":
        raise NotImplementedError

    def predict(self, model: LoadedModel, denoiser, noisy: "torch.Tensor", timesteps: "torch.Tensor",
                text: dict[str, "torch.Tensor"], batch: dict, dtype, cfg=None) -> "torch.Tensor":
        """The denoiser's prediction in the latents' layout, with the family's extra conditioning
        taken from the batch (and training options from the run's config `cfg`, e.g. Flux guidance).
        A family with control_images reads `batch["control_latents"]` (always present, on any device:
        move it to `noisy`'s; diffusion/loss.py encodes it when latents are not cached)."""
        raise NotImplementedError

    def given_frames(self, model: LoadedModel, batch: dict, latent_shape: tuple[int, ...], *, seed: int,
                     epoch: int, cfg) -> "torch.Tensor | None":
        """Image-to-video training with the start frame given (Wan 2.2 TI2V-5B): a (B, F') bool mask of the latent
        frames each sample's denoiser gets clean, or None (every frame is noised and trained: the default).
        diffusion/loss.py hands it to `predict` as batch["given_frames"] (predict puts the clean frames in) and
        leaves those frames out of the loss. Draw it per (seed, epoch, sample index) like the objective's
        randomness, so accumulation, several processes and resume make the same choice."""
        return None

    def use_plain_attention(self, model: LoadedModel) -> None:
        """precision.attention = "default": diffusers' plain attention instead of SDPA."""
        from diffusers.models.attention_processor import AttnProcessor
        model.denoiser.set_attn_processor(AttnProcessor())

    # ---- blocks (network.block_lr)
    # (regular expression on a denoiser module path, block name format with its groups as ints)
    block_patterns: tuple[tuple[str, str], ...] = ()

    def block_of(self, model: LoadedModel, module_path: str) -> str | None:
        """The named block (network.block_lr) a denoiser module belongs to; None: no block."""
        import re
        for pattern, name in self.block_patterns:
            found = re.match(pattern, module_path)
            if found:
                return name.format(*(int(g) for g in found.groups()))
        return None

    # ---- blocks (memory.block_swap)
    def blocks(self, model: LoadedModel) -> list:
        """The denoiser's blocks in the order its forward runs them: the units memory.block_swap keeps in
        CPU memory (training/block_swap.py swaps the last N). Default: the children of every top-level
        nn.ModuleList of the denoiser, in registration order (diffusers' transformers: transformer_blocks,
        then single_transformer_blocks). A family whose registration order is not its forward order, or
        whose blocks are elsewhere, overrides this."""
        import torch
        return [block for child in model.denoiser.children() if isinstance(child, torch.nn.ModuleList)
                for block in child]

    # ---- sampling and outputs
    def pipeline_class(self):
        """The diffusers pipeline class of this family (loads its folders and LoRA files)."""
        raise NotImplementedError

    def model_pipeline_class(self, model: LoadedModel):
        """The pipeline class that samples from `model` and loads its saved folders: the family's one,
        unless its models come with several (Flux.2 Klein and dev)."""
        return self.pipeline_class()

    def prompt_arguments(self, model: LoadedModel, prompt: str | list[str],
                         negative: str | list[str] | None) -> dict:
        """The prompt arguments of a sampling pipeline call. Default: the texts (the pipeline encodes
        them itself); a family whose training encodes text differently (SD's clip_skip) passes its own
        embeddings, so samples see the conditioning the model is trained on."""
        return {"prompt": prompt, "negative_prompt": negative}

    def guidance_arguments(self, model: LoadedModel, scale: float) -> dict:
        """A sampling call's guidance scale (samples' cfg_scale, class images' guidance) as the pipeline
        takes it. Default: `guidance_scale` (classifier-free guidance, or Flux's distilled guidance)."""
        return {"guidance_scale": scale}

    def pipeline_call_options(self, model: LoadedModel) -> dict:
        """Extra keyword arguments for the pipeline's __call__ when sampling (e.g. Flux's T5 length)."""
        return {}

    def build_pipeline(self, model: LoadedModel, scheduler: str = "euler"):
        """A diffusers pipeline over the model's own module objects (adapters included)."""
        raise NotImplementedError

    def after_sampling(self, model: LoadedModel) -> None:
        """After the trainer's samples: move back what build_pipeline brought to the device for sampling only
        (Wan 2.2's frozen expert, outside the trainer); nothing by default."""

    def sampling_only(self, model: LoadedModel) -> list[tuple["torch.nn.Module", list["torch.nn.Module"]]]:
        """Frozen denoisers that join only the sampling pipeline (Wan 2.2's expert that does not train), each
        with its blocks in forward order. The trainer stores them as the frozen base (model.quantize), keeps
        them in host memory and brings them to the device for samples only: whole, or under memory.block_swap
        or memory.offload_encoders one block at a time (training/sampling_residency.py). None by default."""
        return []

    def lora_layouts(self) -> tuple[str, ...]:
        """The LoRA key layouts this family writes (registry.py; the first is its default)."""
        from .registry import entry
        return entry(self.name).lora_layouts

    def lora_layout(self, requested: str = "auto") -> str:
        """output.lora_format resolved for this family ("auto" -> its default); ConfigError when it
        does not write that layout."""
        from ..errors import ConfigError
        layouts = self.lora_layouts()
        if requested in ("", "auto"):
            return layouts[0]
        if requested not in layouts:
            raise ConfigError(f"output.lora_format: {self.label} LoRA files are written in "
                              f"{' or '.join(layouts)} layout, not {requested!r}")
        return requested

    def lora_file_state(self, model: LoadedModel, adapter_states: dict[str, dict[str, "torch.Tensor"]],
                        alpha: float | Callable[[str, str], float], layout: str = "auto") -> dict[str, "torch.Tensor"]:
        """peft adapter weights per component -> the LoRA file in `layout` (see lora_layout), the key
        layout ComfyUI/A1111/kohya/diffusers load."""
        raise NotImplementedError

    def lora_file_suffixes(self, model: LoadedModel) -> tuple[str, ...]:
        """The file-name suffixes of a LoRA output written as several files ('' = the run's own file, first):
        one file by default; Wan 2.2 training both experts adds `_low_noise`."""
        return ("",)

    def lora_file_parts(self, model: LoadedModel, adapter_states: dict[str, dict[str, "torch.Tensor"]]
                        ) -> dict[str, dict[str, dict[str, "torch.Tensor"]]]:
        """Suffix (lora_file_suffixes) -> the adapter states that file holds (each through lora_file_state)."""
        return {"": adapter_states}

    def read_lora_file(self, model: LoadedModel, state: dict[str, "torch.Tensor"], modules: dict):
        """A LoRA file's weights (network.network_weights) in peft's layout, as families/lora_files.py's
        LoraWeights; `modules`: component -> the module its adapters go on. Default: diffusers' layout,
        else what diffusers' own converters read. ConfigError naming network.network_weights otherwise."""
        from .lora_files import is_diffusers_layout, read_diffusers_layout, read_with_diffusers
        if is_diffusers_layout(state, (self.denoiser_name, *self.text_encoder_names)):
            return read_diffusers_layout(state, modules)
        return read_with_diffusers(self.pipeline_class(), state, modules, self.label)

    def diffusers_lora_targets(self, file_state: dict[str, "torch.Tensor"], denoiser) -> set[str]:
        """The denoiser module paths diffusers' own LoRA loader puts this file's adapters on
        (its converters, not ours): the conformance suite checks they are exactly the trained ones."""
        raise NotImplementedError

    def architecture(self, model) -> str:
        """modelspec.architecture of this base model, without an adapter suffix (full files carry it as
        is, LoRA files with `/lora`): the family's, or where its variants differ the loaded variant's."""
        return self.modelspec_architecture

    def base_model_version_of(self, model) -> str:
        """ss_base_model_version of this base model: the family's, or the loaded variant's."""
        return self.base_model_version

    def lora_metadata(self) -> dict[str, str]:
        """Family metadata for LoRA files (ss_base_model_version, modelspec.architecture, ...)."""
        return {"ss_base_model_version": self.base_model_version,
                "modelspec.architecture": f"{self.modelspec_architecture}/lora"}

    def save_full_model(self, model: LoadedModel, folder: Path | None, single_file: Path, dtype=None,
                        metadata: dict[str, str] | None = None) -> list[Path]:
        """A full fine-tune's outputs: the single file (see full_single_file; none when it is None) first,
        then the diffusers folder when `folder` is given."""
        raise NotImplementedError

    def save_text_encoder_files(self, model: LoadedModel, single_file: Path, dtype=None) -> list[Path]:
        """A full fine-tune that trained the text encoders, where the single file holds the denoiser
        only: the trained encoders as the separate files the family's loader takes (none by default)."""
        return []

    def load_denoiser_file(self, path: Path, like):
        """For families whose single file is the denoiser alone: a copy of `like` with its weights."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<family {self.name}>"
