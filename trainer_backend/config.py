"""The one schema: every option is defined here once.

The GUI tabs, the CLI `--set` overrides, presets (sparse TOML), the README's config
reference and validation messages are all derived from these models. Adding an option
means adding one field here plus the code that uses it.

Conventions: no optional (None) values, because TOML has no null; "" or 0 mean "off".
Each field carries `help` text and a `ui` hint (widget, advanced) in json_schema_extra.
"""
from __future__ import annotations

import difflib
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError

CONFIG_VERSION = 1


class ConfigError(ValueError):
    """A config problem a user can fix; `str()` is one line naming the key or file."""


def F(default: Any, help: str, *, widget: str = "", advanced: bool = False,
      secret: bool = False, **bounds: Any) -> Any:
    """A schema field: default, help text, UI hint, and pydantic bounds (ge, le, ...)."""
    extra = {"ui": {"widget": widget, "advanced": advanced}, "secret": secret}
    return Field(default, description=help, json_schema_extra=extra, **bounds)


class Section(BaseModel):
    """One [table] of the config. TAB names the GUI tab that shows it."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    TAB: ClassVar[str] = "Other"


class Output(Section):
    """Where the run directory goes."""
    TAB: ClassVar[str] = "Model"
    dir: str = F("runs", "Folder that holds run directories.", widget="path")
    name: str = F("my-lora", "Run name; the run directory is <dir>/<name> and the output file <name>.safetensors.",
                  min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._ -]*$")


class Model(Section):
    """The base model."""
    TAB: ClassVar[str] = "Model"
    path: str = F("", "Diffusers folder, single-file .safetensors checkpoint, or builtin:tiny-sd1|tiny-sd2|tiny-sdxl.",
                  widget="path")
    arch: Literal["auto", "sd1", "sd2", "sdxl"] = F("auto", "Architecture; auto detects it from the model.")
    vae: str = F("", "Optional VAE to use instead of the model's own (diffusers folder or file).",
                 widget="path", advanced=True)
    prediction_type: Literal["auto", "epsilon", "v_prediction"] = F(
        "auto", "What the UNet predicts; auto reads the model's scheduler config (SD2-768 is v_prediction).",
        advanced=True)
    tokenizer: str = F("", "CLIP tokenizer for a single-file checkpoint that carries none: a diffusers model folder of "
                           "any SD family, or a folder with vocab.json + merges.txt. Empty = look in the Hugging "
                           "Face cache (offline).", widget="path", advanced=True)


class DatasetSubset(Section):
    """One [[dataset.subsets]] entry: another folder with its own repeats, captions and augmentation.
    Options left at "inherit" (or -1 / "") take the value from [dataset]."""
    path: str = F("", "Folder of this subset (images + captions, or the root that metadata paths are relative to).",
                  widget="path", min_length=1)
    source: Literal["inherit", "folders", "metadata"] = F("inherit", "folders or metadata (JSON) mode.")
    metadata_path: str = F("", "Metadata JSON file or folder of JSON files; empty = search this subset's path.",
                           widget="path")
    repeats: int = F(0, "Repeats; 0 = from an N_concept folder name, else dataset.repeats.", ge=0, le=10000)
    caption_extension: str = F("", "Caption file extension; empty = dataset.caption_extension.",
                               pattern=r"^(\.[A-Za-z0-9_]+)?$")
    class_tokens: str = F("", "Caption for images without one; empty = the concept of an N_concept folder name.")
    flip: Literal["inherit", True, False] = F("inherit", "Random horizontal flip.")
    center_crop: Literal["inherit", True, False] = F("inherit", "Center crop (false: random crop).")
    caption_dropout: float = F(-1.0, "Probability of an empty caption; -1 = inherit.", ge=-1.0, le=1.0)
    shuffle_tags: Literal["inherit", True, False] = F("inherit", "Shuffle tags after the first keep_tokens.")
    keep_tokens: int = F(-1, "Leading tags kept in place; -1 = inherit.", ge=-1, le=1000)
    tag_dropout: float = F(-1.0, "Probability of dropping each tag; -1 = inherit.", ge=-1.0, le=1.0)


class Dataset(Section):
    """Training images and captions."""
    TAB: ClassVar[str] = "Dataset"
    path: str = F("", "Folder of images with same-named caption files; kohya-style N_concept subfolders give repeats.",
                  widget="path")
    source: Literal["folders", "metadata"] = F(
        "folders", "folders: images with caption files (flat or N_concept subfolders); metadata: per-image JSON files "
                   "with tags, score and path.")
    metadata_path: str = F("", "Metadata mode: a JSON file or a folder tree of JSON files; empty = search dataset.path.",
                           widget="path", advanced=True)
    subsets: list[DatasetSubset] = F([], "More folders, each with its own repeats, captions and augmentation "
                                         "([[dataset.subsets]] tables); used together with dataset.path.",
                                     widget="subsets", advanced=True)
    resolution: int = F(512, "Training resolution (square side, or the target area's side when bucketing).",
                        ge=32, le=4096, multiple_of=8)
    caption_extension: str = F(".txt", "Caption file extension.", pattern=r"^\.[A-Za-z0-9_]+$")
    repeats: int = F(1, "Repeats for images in a flat folder (N_concept folders carry their own).", ge=1, le=10000)
    class_tokens: str = F("", "Caption for flat-folder images that have no caption file (N_concept folders use the "
                              "concept).")
    class_path: str = F("", "Class (regularization) images for prior preservation; empty = none.", widget="path")
    class_prompt: str = F("", "Caption for every class image; empty = their caption files or folder names.")
    class_samples: int = F(0, "Class samples per epoch; 0 = as many as the instance samples (class images are "
                              "cycled if there are fewer).", ge=0)
    num_class_images: int = F(0, "DreamBooth prior preservation: class images wanted. When class_path holds fewer "
                                 "(or is empty), the missing ones are generated with the base model from "
                                 "class_prompt before training, into a cache outside the dataset, and reused by "
                                 "later runs. 0 = never generate.", ge=0, le=100000)
    prior_loss_weight: float = F(1.0, "Weight of the prior-preservation loss (the class samples' loss).", ge=0.0,
                                 le=100.0)
    class_negative_prompt: str = F("", "Negative prompt used when generating class images.", advanced=True)
    class_generation_steps: int = F(30, "Sampling steps per generated class image.", ge=1, le=1000, advanced=True)
    class_guidance_scale: float = F(7.5, "CFG scale for generated class images.", ge=0.0, le=50.0, advanced=True)
    class_generation_batch_size: int = F(4, "Class images generated per batch.", ge=1, le=256, advanced=True)
    bucketing: bool = F(False, "Aspect-ratio bucketing: batches of same-shaped images near resolution² in area, "
                               "instead of square crops.")
    bucket_min_side: int = F(0, "Smallest bucket side; images whose shorter side is smaller are skipped. "
                                "0 = resolution/2.", ge=0, le=8192, multiple_of=8, advanced=True)
    bucket_max_side: int = F(0, "Largest bucket side; 0 = resolution×2.", ge=0, le=16384, multiple_of=8,
                             advanced=True)
    bucket_step: int = F(64, "Bucket sides are multiples of this.", ge=8, le=512, multiple_of=8, advanced=True)
    bucket_no_upscale: bool = F(False, "Never upscale: small images get a smaller bucket of their own size.",
                                advanced=True)
    flip: bool = F(False, "Random horizontal flip.")
    center_crop: bool = F(True, "Center crop (off: random crop).", advanced=True)
    caption_dropout: float = F(0.0, "Probability of training a sample with an empty caption.", ge=0.0, le=1.0,
                               advanced=True)
    shuffle_tags: bool = F(False, "Shuffle comma-separated tags (after the first keep_tokens).", advanced=True)
    shuffle_tags_p: float = F(1.0, "Probability that a sample's tags are shuffled when shuffle_tags is on.",
                              ge=0.0, le=1.0, advanced=True)
    keep_tokens: int = F(0, "Leading tags kept in place when shuffling.", ge=0, advanced=True)
    tag_dropout: float = F(0.0, "Probability of dropping each tag (after the first keep_tokens).", ge=0.0, le=1.0,
                           advanced=True)
    caption_separator: str = F(",", "Separator between tags in caption files (for shuffle and tag dropout).",
                               min_length=1, advanced=True)
    ignore_tags: list[str] = F([], "Metadata mode: skip images that have any of these tags.", advanced=True)
    remove_tags: list[str] = F([], "Metadata mode: tags removed from captions.", advanced=True)
    replace_tags: dict[str, str] = F({}, "Metadata mode: text replaced inside every tag, in order, e.g. "
                                         "{\" \" = \"_\", \"artist:\" = \"by=\"}.", widget="table", advanced=True)
    tag_separator: str = F(", ", "Metadata mode: separator used to join tags into the caption.", min_length=1,
                           advanced=True)
    abs_min_score: float = F(0.0, "Metadata mode: skip images whose score is below this; 0 = off.", advanced=True)
    min_score: float = F(0.0, "Metadata mode: skip images whose score plus tag_bonus_scores is below this; 0 = off.",
                         advanced=True)
    tag_bonus_scores: dict[str, float] = F({}, "Metadata mode: score added per tag before the min_score check, "
                                               "e.g. {solo = 100, sketch = -75}.", widget="table", advanced=True)
    score_tags: list[int] = F([], "Metadata mode: score thresholds; the highest one exceeded adds a tag, e.g. "
                                  "[800, 400] makes score 900 add scr800.", advanced=True)
    score_tag_prefix: str = F("scr", "Metadata mode: prefix of score tags.", advanced=True)
    validation_every_nth: int = F(0, "Hold out every Nth image (metadata record or file, sorted) for validation; "
                                     "0 = off.", ge=0, advanced=True)
    alpha_background: Literal["white", "black", "gray"] = F(
        "white", "Background that transparent images are composited on.", advanced=True)
    max_image_megapixels: float = F(100.0, "Skip images larger than this (decompression-bomb guard).", gt=0.0,
                                    le=1000.0, advanced=True)
    verify_images: bool = F(True, "Decode every image while scanning so corrupt files are skipped before training "
                                  "starts (slower start on very large datasets).", advanced=True)
    cache_latents: bool = F(False, "Encode images with the VAE once and reuse the latents (turns off random crop/flip "
                                   "variety unless both flips are cached).")
    cache_latents_to_disk: bool = F(False, "Keep cached latents on disk (reused by later runs) instead of in memory.")
    cache_dir: str = F("", "Cache folder (outside the dataset); empty = <output.dir>/.cache.", widget="path",
                       advanced=True)
    cache_both_flips: bool = F(True, "With flip and latent caching on, cache both orientations (2× encoding); "
                                     "off = flip is disabled while caching.", advanced=True)
    cache_text_encoder_outputs: bool = F(False, "Encode each caption once when the text encoders are frozen and "
                                                "captions are static (no shuffle/dropout).", advanced=True)
    num_workers: int = F(0, "DataLoader worker processes.", ge=0, le=64, advanced=True)


class Network(Section):
    """What is trained."""
    TAB: ClassVar[str] = "Network"
    type: Literal["lora", "loha", "lokr", "full", "vae"] = F(
        "lora", "lora / loha / lokr adapters (peft), or full fine-tuning of the UNet (and the text encoders with "
                "train_text_encoder). With class images this is DreamBooth (see docs/methods.md). vae: fine-tune "
                "the autoencoder on the dataset's images (see [vae]).")
    rank: int = F(16, "Adapter rank (dim).", ge=1, le=1024)
    alpha: float = F(16.0, "Adapter alpha; the update is scaled by alpha/rank.", gt=0)
    dropout: float = F(0.0, "Dropout on the adapter's input.", ge=0.0, lt=1.0, advanced=True)
    target_modules: list[str] = F(["to_q", "to_k", "to_v", "to_out.0"],
                                  "UNet module names that get adapters.", advanced=True)
    train_text_encoder: bool = F(False, "Also train adapters on the text encoder(s).")
    text_encoder_lr: float = F(0.0, "Learning rate for text-encoder adapters; 0 = optimizer.lr.", ge=0.0,
                               advanced=True)
    text_encoder_target_modules: list[str] = F(["q_proj", "k_proj", "v_proj", "out_proj"],
                                               "Text-encoder module names that get adapters.", advanced=True)
    dora: bool = F(False, "LoRA only: weight-decomposed LoRA (DoRA). Saved in diffusers format (no kohya/webui "
                          "DoRA format is written).")
    conv_rank: int = F(0, "Also put adapters on the UNet's convolutions (LoCon-style) with this rank; 0 = off.",
                       ge=0, le=1024)
    conv_alpha: float = F(1.0, "Alpha of the convolution adapters.", gt=0)
    conv_target_modules: list[str] = F(["conv1", "conv2", "conv_shortcut", "downsamplers.0.conv",
                                        "upsamplers.0.conv"], "UNet convolution names that get adapters when "
                                       "conv_rank > 0.", advanced=True)
    lokr_factor: int = F(-1, "LoKr: Kronecker factor of the weight's dimensions; -1 = as square as possible.",
                         ge=-1, le=1024, advanced=True)
    save_precision: Literal["fp32", "fp16", "bf16"] = F(
        "fp16", "Full fine-tune: precision of the saved diffusers folder and single-file checkpoint.")


class Optimizer(Section):
    """Optimizer and learning-rate schedule."""
    TAB: ClassVar[str] = "Optimizer & schedule"
    name: Literal["adamw", "adamw8bit", "prodigy", "lion", "adafactor", "sgd"] = F(
        "adamw", "Optimizer; adamw8bit/prodigy/lion need their packages installed.")
    lr: float = F(1e-4, "Learning rate.", gt=0.0, le=10.0)
    weight_decay: float = F(0.01, "Decoupled weight decay.", ge=0.0, advanced=True)
    beta1: float = F(0.9, "Adam beta1.", ge=0.0, lt=1.0, advanced=True)
    beta2: float = F(0.999, "Adam beta2.", ge=0.0, lt=1.0, advanced=True)
    eps: float = F(1e-8, "Adam epsilon.", gt=0.0, advanced=True)
    max_grad_norm: float = F(1.0, "Clip gradients to this norm; 0 = off.", ge=0.0)
    scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts",
                       "polynomial"] = F("constant", "Learning-rate schedule.")
    warmup_steps: int = F(0, "Warmup optimizer steps.", ge=0)
    lr_cycles: int = F(1, "Cycles for cosine_with_restarts.", ge=1, advanced=True)


class Schedule(Section):
    """Batching and length."""
    TAB: ClassVar[str] = "Optimizer & schedule"
    batch_size: int = F(1, "Batch size per GPU/process.", ge=1, le=4096)
    grad_accum: int = F(1, "Gradient accumulation steps per optimizer step.", ge=1, le=4096)
    epochs: int = F(10, "Epochs (used when max_steps is 0).", ge=1, le=100000)
    max_steps: int = F(0, "Total optimizer steps; 0 = use epochs.", ge=0)
    seed: int = F(42, "Random seed (data order, noise, initial weights).", ge=0)


class Loss(Section):
    """Noise and loss shaping."""
    TAB: ClassVar[str] = "Optimizer & schedule"
    noise_offset: float = F(0.0, "Noise offset (helps very dark/bright images).", ge=0.0, le=1.0)
    min_snr_gamma: float = F(0.0, "Min-SNR weighting gamma; 0 = off (5 is typical).", ge=0.0)
    timestep_min: int = F(0, "Lowest training timestep.", ge=0, le=999, advanced=True)
    timestep_max: int = F(1000, "Highest training timestep (exclusive).", ge=1, le=1000, advanced=True)


class Precision(Section):
    """Precision and memory."""
    TAB: ClassVar[str] = "Precision & memory"
    mixed: Literal["no", "fp16", "bf16"] = F("bf16", "Mixed precision; frozen weights in this dtype, trainable in fp32.")
    gradient_checkpointing: bool = F(False, "Recompute activations in backward to save memory.")
    attention: Literal["sdpa", "default"] = F("sdpa", "Attention kernel: PyTorch SDPA or the plain one.",
                                               advanced=True)
    full_bf16: bool = F(False, "Keep the trained weights themselves in bf16, with no fp32 master copy (weights, "
                               "gradients and optimizer state take about half the memory; what made full fine-tunes "
                               "and DreamBooth fit on 24 GB cards). Needs mixed = bf16. Meant for network.type = "
                               "full; see half_weights_rounding.", advanced=True)
    full_fp16: bool = F(False, "Like full_bf16 in fp16 (needs mixed = fp16). fp16's narrow range overflows more "
                               "easily than bf16: prefer full_bf16 where the GPU supports bf16.", advanced=True)
    half_weights_rounding: Literal["stochastic", "kahan", "nearest"] = F(
        "stochastic", "With full_bf16/full_fp16 and the adamw or sgd optimizer: how each update is written into "
                      "the half-precision weights. stochastic: randomly rounded up or down in proportion, so small "
                      "updates survive on average (no extra memory); kahan: a compensation buffer keeps the rounding "
                      "error (2 more bytes per weight, the most exact); nearest: plain rounding (updates below the "
                      "weight's precision are lost).", advanced=True)


class Hardware(Section):
    """GPUs and processes."""
    TAB: ClassVar[str] = "GPUs"
    num_processes: int = F(1, "Processes (GPUs) on this machine.", ge=1, le=64)
    gpu_ids: str = F("all", "GPU ids to use, e.g. 0,1 or all.", pattern=r"^(all|\d+(,\d+)*)$")
    multi_gpu_policy: Literal["same_samples", "same_steps"] = F(
        "same_samples", "same_samples: N GPUs see as many samples as 1 GPU would; same_steps: same optimizer steps, "
                        "N times the samples.")
    keep_steps_per_epoch: bool = F(
        False, "same_samples only: instead of sharing each epoch across the GPUs, divide every subset's repeats by "
               "the number of processes (rounded, at least 1) and multiply the epochs: more, shorter epochs, the "
               "same samples in total.", advanced=True)
    lr_scaling: Literal["none", "linear", "sqrt"] = F(
        "none", "Scale the learning rate with the effective batch relative to 1 GPU: linear (×N) or sqrt (×√N).")
    cpu: bool = F(False, "Force the CPU even when a GPU is present (multi-process CPU uses gloo).", advanced=True)
    strategy: Literal["ddp", "deepspeed", "fsdp"] = F(
        "ddp", "ddp: every GPU holds the whole model (best for LoRA); deepspeed: ZeRO sharding/offload; "
               "fsdp: PyTorch fully sharded data parallel (full fine-tunes of big models).")
    num_machines: int = F(1, "Machines (nodes) in a multi-node run; each runs num_processes processes.",
                          ge=1, le=1024, advanced=True)
    machine_rank: int = F(0, "This machine's rank in a multi-node run (0 = the main machine).", ge=0, le=1023,
                          advanced=True)
    main_process_ip: str = F("", "Multi-node: address of machine 0, reachable from every node.",
                             pattern=r"^[A-Za-z0-9.:_\-\[\]]*$", advanced=True)
    main_process_port: int = F(0, "Port of the main process; 0 = a free port on one machine (29500 when several "
                                  "machines, which must all use the same port).", ge=0, le=65535, advanced=True)
    deepspeed_zero_stage: int = F(2, "DeepSpeed ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also "
                                     "the parameters.", ge=1, le=3, advanced=True)
    deepspeed_offload_optimizer: bool = F(False, "DeepSpeed: keep optimizer states in CPU memory (slower, "
                                                 "saves GPU memory).", advanced=True)
    deepspeed_offload_params: bool = F(False, "DeepSpeed: keep parameters in CPU memory (ZeRO-3 only).",
                                       advanced=True)
    fsdp_sharding: Literal["full_shard", "shard_grad_op"] = F(
        "full_shard", "FSDP: full_shard shards parameters, gradients and optimizer states; shard_grad_op keeps "
                      "parameters whole between forward and backward (faster, more memory).", advanced=True)
    fsdp_auto_wrap: Literal["transformer", "size", "none"] = F(
        "transformer", "FSDP: wrap each block named in fsdp_wrap_classes, blocks above fsdp_min_params, or the "
                       "whole model as one unit.", advanced=True)
    fsdp_wrap_classes: str = F("BasicTransformerBlock,ResnetBlock2D", "FSDP: module class names wrapped as units "
                               "(transformer auto-wrap).", pattern=r"^[A-Za-z_]\w*(,[A-Za-z_]\w*)*$", advanced=True)
    fsdp_min_params: int = F(100_000_000, "FSDP: parameters per unit for size auto-wrap.", ge=1000, advanced=True)
    fsdp_offload_params: bool = F(False, "FSDP: keep parameters and gradients in CPU memory.", advanced=True)
    ddp_gradient_as_bucket_view: bool = F(True, "DDP: gradients are views into the communication buckets (saves "
                                                "one gradient copy of memory).", advanced=True)
    ddp_static_graph: bool = F(False, "DDP: the set of used parameters never changes between steps (lets DDP "
                                      "optimize; wrong when it does change).", advanced=True)
    ddp_find_unused_parameters: bool = F(False, "DDP: search for parameters without gradients every step "
                                                "(needed only when some trainable modules are skipped; slower).",
                                         advanced=True)
    ddp_bucket_cap_mb: int = F(25, "DDP: gradient bucket size in MB.", ge=1, le=4096, advanced=True)
    collective_timeout_s: int = F(1800, "Seconds a process waits for the others (e.g. while the main process "
                                        "caches latents) before the run fails.", ge=60, le=86400, advanced=True)


class Checkpoints(Section):
    """Saving and resuming (see docs/checkpoints.md)."""
    TAB: ClassVar[str] = "Checkpoints & cloud"
    every_n_steps: int = F(0, "Save a checkpoint every N optimizer steps; 0 = off.", ge=0)
    every_n_epochs: int = F(0, "Save a checkpoint every N epochs (at the epoch's end); 0 = off.", ge=0)
    every_n_minutes: float = F(0.0, "Save a checkpoint when this many minutes passed since the last one; 0 = off.",
                               ge=0.0)
    keep_last: int = F(3, "Checkpoints kept locally (older ones are pruned).", ge=1)
    keep_every_n_steps: int = F(0, "Also save at every multiple of N steps and keep those checkpoints forever "
                                   "(e.g. 2000); 0 = off.", ge=0, advanced=True)
    keep_best: int = F(0, "Also keep the N checkpoints with the lowest best_metric; 0 = off.", ge=0, advanced=True)
    best_metric: Literal["loss", "validation_loss"] = F(
        "loss", "Metric for keep_best (lower is better): loss = mean training loss since the previous checkpoint; "
                "validation_loss = the latest [validation] loss (needs validation turned on).", advanced=True)
    at_end: bool = F(True, "Save a final checkpoint, so a finished run can be continued with more epochs.",
                     advanced=True)
    export_at: Literal["none", "epochs", "checkpoints"] = F(
        "none", "Also write the LoRA file named with the step (<name>-step00000100.safetensors): at the checkpoints "
                "of every_n_epochs (epochs) or with every checkpoint (checkpoints).")
    resume: str = F("auto", "auto (newest valid checkpoint, local or in [cloud], else a fresh start), none, or a "
                            "checkpoint folder or s3://bucket/prefix/…/step-XXXXXXXX.")


class Cloud(Section):
    """S3-compatible storage (AWS S3, Cloudflare R2, MinIO, …): checkpoints, outputs and samples are copied to
    s3://<bucket>/<prefix>/<output.name>/ in the background. Credentials come from the environment or
    secrets_file, never from this config."""
    TAB: ClassVar[str] = "Checkpoints & cloud"
    bucket: str = F("", "Bucket name; empty = no cloud sync.", pattern=r"^[A-Za-z0-9._-]*$")
    prefix: str = F("", "Key prefix inside the bucket (the run goes under <prefix>/<output.name>/).",
                    pattern=r"^[A-Za-z0-9._/ -]*$")
    endpoint_url: str = F("", "S3 endpoint for R2, MinIO, …; empty = AWS.", pattern=r"^(https?://\S+)?$")
    region: str = F("", "Region; empty = the environment's default (R2 uses auto).")
    upload_checkpoints: bool = F(True, "Upload every checkpoint (its manifest last).")
    upload_outputs: bool = F(True, "Upload the outputs, exported LoRA files and the run's config, events and log.")
    upload_samples: bool = F(True, "Upload sample images.")
    keep_last: int = F(0, "Checkpoints kept in the bucket; 0 = as checkpoints.keep_last (keep_every_n_steps and "
                          "keep_best apply too).", ge=0)
    secrets_file: str = F("", "File (mode 0600) of NAME=value lines holding the credentials named here and in "
                              "[webhooks]; the environment is searched first.", widget="path")
    access_key_name: str = F("AWS_ACCESS_KEY_ID", "Name of the secret (environment variable or secrets_file line) "
                                                 "holding the access key id.", advanced=True)
    secret_key_name: str = F("AWS_SECRET_ACCESS_KEY", "Name of the secret holding the secret access key.",
                             advanced=True)
    addressing_style: Literal["auto", "path", "virtual"] = F(
        "auto", "URL style; auto = path style when endpoint_url is set (MinIO, R2), virtual hosts on AWS.",
        advanced=True)
    multipart_mb: int = F(64, "Files above this size go up in parts of this size (multipart upload).", ge=5,
                          le=5000, advanced=True)
    timeout_s: int = F(60, "Seconds one S3 request may take before it is retried (with backoff).", ge=1, le=3600,
                       advanced=True)
    final_wait_s: int = F(600, "At the end of a run (or after a stop), wait at most this long for uploads.",
                          ge=0, le=86400, advanced=True)


class WebhookTarget(Section):
    """One [[webhooks.targets]] entry."""
    url: str = F("", "http(s) URL. Discord URLs carry their token: leave this empty and use url_secret.",
                 pattern=r"^(https?://\S+)?$")
    url_secret: str = F("", "Name of the secret (environment variable or cloud.secrets_file line) holding the URL.")
    format: Literal["json", "discord"] = F("json", "json: the payload as JSON; discord: a Discord message (sample "
                                                   "images attached).")
    auth_secret: str = F("", "Name of the secret whose value is sent as the auth header (e.g. 'Bearer abc'); "
                             "empty = none.")
    auth_header: str = F("Authorization", "Header that carries auth_secret.", pattern=r"^[A-Za-z0-9-]+$")
    events: list[Literal["start", "checkpoint", "sample", "epoch", "done", "error", "preempted", "stopped"]] = F(
        ["start", "checkpoint", "sample", "epoch", "done", "error", "preempted", "stopped"], "Events sent.")


class Webhooks(Section):
    """HTTP notifications at start, checkpoints, samples, epochs and the end; never slow training down."""
    TAB: ClassVar[str] = "Checkpoints & cloud"
    targets: list[WebhookTarget] = F([], "Webhook URLs, each a [[webhooks.targets]] table with url or url_secret, "
                                         "format, auth_secret, auth_header and events.")
    timeout_s: float = F(5.0, "Seconds per request before it is abandoned.", gt=0.0, le=120.0, advanced=True)
    retries: int = F(2, "Retries of a failed request (with backoff).", ge=0, le=10, advanced=True)


class Ema(Section):
    """Exponential moving average of the trained weights (full fine-tune or adapters)."""
    TAB: ClassVar[str] = "Network"
    enabled: bool = F(False, "Keep an EMA copy of the trainable weights.")
    decay: float = F(0.999, "EMA decay per optimizer step (0.999 averages over roughly the last 1000 steps).",
                     gt=0.0, lt=1.0)
    every_n_steps: int = F(1, "Update the EMA every N optimizer steps (decay^N per update, so the average spans "
                              "the same steps; saves time when the EMA is on the CPU).", ge=1, le=100000)
    device: Literal["cpu", "accelerator"] = F("cpu", "cpu: EMA weights in system RAM (saves GPU memory); "
                                                     "accelerator: next to the weights (faster updates).")
    use_for_samples: bool = F(True, "Generate sample images with the EMA weights.")
    use_for_output: bool = F(True, "Save the EMA weights as the final output (checkpoints always hold both).")


class Samples(Section):
    """Sample images during training."""
    TAB: ClassVar[str] = "Samples"
    prompts: str = F("", "One prompt per line. Options after the prompt, kohya style: --n negative prompt, "
                         "--w width, --h height, --d seed, --s steps, --l CFG scale. Lines starting with # are "
                         "ignored.", widget="textarea")
    prompt_file: str = F("", "Text file with more prompts, same format (used after samples.prompts).",
                         widget="path")
    every_n_steps: int = F(0, "Sample every N optimizer steps; 0 = off.", ge=0)
    every_n_epochs: int = F(0, "Sample at the end of every N-th epoch; 0 = off.", ge=0)
    before_first_step: bool = F(False, "Also sample once before training starts (the untrained model).")
    width: int = F(0, "Default width; 0 = dataset.resolution.", ge=0, le=4096, multiple_of=8)
    height: int = F(0, "Default height; 0 = dataset.resolution.", ge=0, le=4096, multiple_of=8)
    steps: int = F(20, "Default sampling steps.", ge=1, le=1000)
    cfg_scale: float = F(7.0, "Default classifier-free guidance scale.", ge=0.0, le=50.0)
    seed: int = F(1234, "Seed of the first prompt; prompt i uses seed + i unless its line sets --d.", ge=0)
    negative_prompt: str = F("", "Default negative prompt.")
    scheduler: Literal["euler", "euler_a", "ddim", "dpmpp_2m", "pndm", "unipc", "ddpm", "default"] = F(
        "euler", "Sampler; default = the model's own scheduler.", advanced=True)


class Validation(Section):
    """Validation loss on held-out images at fixed timesteps and noise, comparable across evaluations
    (off by default; costs nothing when off). The images: validation.path, else the ones held out by
    validation.fraction or dataset.validation_every_nth."""
    TAB: ClassVar[str] = "Samples"
    every_n_steps: int = F(0, "Compute the validation loss every N optimizer steps; 0 = off.", ge=0)
    every_n_epochs: int = F(0, "Compute the validation loss at the end of every N-th epoch; 0 = off.", ge=0)
    path: str = F("", "A separate folder of validation images with captions; empty = hold images out of the "
                      "dataset (fraction or dataset.validation_every_nth).", widget="path")
    fraction: float = F(0.0, "Hold out this fraction of the dataset's images (spread evenly, in sorted order) for "
                             "validation; 0 = off.", ge=0.0, lt=1.0)
    timesteps: int = F(4, "Fixed timesteps per image, evenly spread over the training range: more gives a "
                          "steadier loss at proportional cost.", ge=1, le=100, advanced=True)
    batch_size: int = F(0, "Validation batch size; 0 = schedule.batch_size.", ge=0, le=4096, advanced=True)


class Vae(Section):
    """Autoencoder (VAE) fine-tuning, with network.type = vae: reconstruct the dataset's images."""
    TAB: ClassVar[str] = "Network"
    loss: Literal["l1", "mse"] = F("l1", "Reconstruction loss on pixels: l1 keeps edges sharper, mse penalises "
                                         "large errors more (no perceptual loss: it needs pretrained weights).")
    kl_weight: float = F(1e-6, "Weight of the KL term that keeps the latents close to a unit Gaussian (encoder "
                               "training only).", ge=0.0, le=1.0)
    decoder_only: bool = F(True, "Train only the decoder. The encoder, and so the latent space, stays as it was: "
                                 "LoRAs and checkpoints trained on the base VAE's latents keep working.")
    precision: Literal["fp32", "bf16", "fp16"] = F(
        "fp32", "Training precision (precision.mixed does not apply). fp32 is the safe default; fp16 is refused: "
                "the VAE's activations overflow fp16 and the loss turns NaN.")
    save_precision: Literal["fp32", "fp16", "bf16"] = F("fp32", "Precision of the saved VAE folder and file.")


class Logging(Section):
    """Console, TensorBoard and events."""
    TAB: ClassVar[str] = "Logging"
    log_every: int = F(1, "Write a step event every N optimizer steps.", ge=1, advanced=True)
    tensorboard: bool = F(True, "Write TensorBoard scalars to <run>/tb.")
    tracker: Literal["none", "wandb"] = F(
        "none", "Experiment tracker besides TensorBoard: wandb = Weights & Biases through accelerate (needs the "
                "wandb package; loss, LR, epoch, samples, validation loss and the config without secrets).")
    wandb_project: str = F("", "W&B project; empty = sd-studio.", pattern=r"^[A-Za-z0-9._ -]*$")
    wandb_run_name: str = F("", "W&B run name; empty = output.name.")
    wandb_entity: str = F("", "W&B entity (user or team); empty = your default entity.", advanced=True)
    wandb_mode: Literal["online", "offline"] = F(
        "online", "online: stream to W&B (needs an API key); offline: write the run under <run>/wandb and upload "
                  "it later with `wandb sync`.")
    wandb_key_name: str = F("WANDB_API_KEY", "Name of the secret (environment variable or cloud.secrets_file line) "
                                             "holding the W&B API key; the key itself never goes in the config.",
                            pattern=r"^[A-Za-z0-9_.-]+$", advanced=True)


class TrainConfig(BaseModel):
    """A complete run configuration."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    version: int = F(CONFIG_VERSION, "Config format version.", ge=1)
    output: Output = Field(default_factory=Output)
    model: Model = Field(default_factory=Model)
    dataset: Dataset = Field(default_factory=Dataset)
    network: Network = Field(default_factory=Network)
    optimizer: Optimizer = Field(default_factory=Optimizer)
    schedule: Schedule = Field(default_factory=Schedule)
    loss: Loss = Field(default_factory=Loss)
    precision: Precision = Field(default_factory=Precision)
    hardware: Hardware = Field(default_factory=Hardware)
    checkpoints: Checkpoints = Field(default_factory=Checkpoints)
    cloud: Cloud = Field(default_factory=Cloud)
    webhooks: Webhooks = Field(default_factory=Webhooks)
    ema: Ema = Field(default_factory=Ema)
    samples: Samples = Field(default_factory=Samples)
    validation: Validation = Field(default_factory=Validation)
    vae: Vae = Field(default_factory=Vae)
    logging: Logging = Field(default_factory=Logging)

    @property
    def run_dir(self) -> Path:
        return Path(self.output.dir) / self.output.name


# ----------------------------------------------------------------------------- introspection

def sections() -> dict[str, type[Section]]:
    """Section name -> model class, in schema order."""
    out = {}
    for name, info in TrainConfig.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, Section):
            out[name] = ann
    return out


def field_info(section: str, key: str) -> dict[str, Any]:
    """Type, default, bounds, choices, help and UI hint of one field (for GUI/README)."""
    info = sections()[section].model_fields[key]
    extra = info.json_schema_extra or {}
    meta: dict[str, Any] = {"section": section, "key": key, "help": info.description or "",
                            "tab": sections()[section].TAB,
                            "default": info.get_default(call_default_factory=True),
                            "ui": dict(extra.get("ui", {})), "secret": extra.get("secret", False)}
    ann = info.annotation
    if getattr(ann, "__origin__", None) is Literal:
        meta["type"], meta["choices"] = "choice", list(ann.__args__)
    else:
        meta["type"] = {bool: "bool", int: "int", float: "float", str: "str"}.get(ann, "list")
    for m in info.metadata:
        for bound in ("ge", "gt", "le", "lt", "multiple_of", "pattern", "min_length"):
            if getattr(m, bound, None) is not None:
                meta[bound] = getattr(m, bound)
    return meta


def all_fields() -> list[dict[str, Any]]:
    return [field_info(s, k) for s, cls in sections().items() for k in cls.model_fields]


# ----------------------------------------------------------------------------- migrations

def _migrate_0_to_1(data: dict) -> dict:
    """Version 0 (unversioned early drafts) called the network rank `dim`."""
    net = data.get("network", {})
    if isinstance(net, dict) and "dim" in net and "rank" not in net:
        net["rank"] = net.pop("dim")
    return data


MIGRATIONS = {0: _migrate_0_to_1}


def migrate(data: dict) -> dict:
    """Bring a raw config dict up to CONFIG_VERSION (missing version means current)."""
    version = data.get("version", CONFIG_VERSION)
    if not isinstance(version, int) or version > CONFIG_VERSION:
        raise ConfigError(f"version: unsupported config version {version!r} (this build reads up to {CONFIG_VERSION})")
    while version < CONFIG_VERSION:
        data = MIGRATIONS[version](data)
        version += 1
    data["version"] = CONFIG_VERSION
    return data


# ----------------------------------------------------------------------------- validation

def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_unknown_keys(data: dict) -> None:
    """Reject unknown sections and keys with a suggestion, before pydantic sees them."""
    secs = sections()
    top = ["version", *secs]
    for name, value in data.items():
        if name not in top:
            raise ConfigError(f"{name}: unknown section or key{_suggest(name, top)}")
        if name in secs:
            if not isinstance(value, dict):
                raise ConfigError(f"{name}: must be a table ([{name}]), got {value!r}")
            keys = list(secs[name].model_fields)
            for key in value:
                if key not in keys:
                    raise ConfigError(f"{name}.{key}: unknown key{_suggest(key, keys)}")


def _describe(err: dict) -> str:
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"]
    ctx = err.get("ctx") or {}
    if err["type"] == "greater_than_equal":
        msg = f"must be ≥ {ctx['ge']}"
    elif err["type"] == "less_than_equal":
        msg = f"must be ≤ {ctx['le']}"
    elif err["type"] == "literal_error":
        msg = f"must be one of {ctx.get('expected')}"
    return f"{loc}: {msg}, got {err.get('input')!r}"


def from_dict(data: dict) -> TrainConfig:
    """Validate a (possibly sparse) dict into a complete config; errors name the key."""
    data = migrate(dict(data))
    check_unknown_keys(data)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e.errors()[0])) from None


def to_dict(cfg: TrainConfig) -> dict:
    return cfg.model_dump(mode="json")


def sparse_dict(cfg: TrainConfig) -> dict:
    """Only what differs from the defaults (for presets), plus the version."""
    full, default = to_dict(cfg), to_dict(TrainConfig())
    out: dict[str, Any] = {"version": full["version"]}
    for sec, values in full.items():
        if isinstance(values, dict):
            diff = {k: v for k, v in values.items() if v != default[sec][k]}
            if diff:
                out[sec] = diff
    return out


def strip_secrets(data: dict) -> dict:
    """A copy of a config dict without fields marked secret."""
    out = {}
    for sec, values in data.items():
        if isinstance(values, dict) and sec in sections():
            fields = sections()[sec].model_fields
            out[sec] = {k: v for k, v in values.items()
                        if not (k in fields and (fields[k].json_schema_extra or {}).get("secret"))}
        else:
            out[sec] = values
    return out


# ----------------------------------------------------------------------------- TOML and overrides

def load_toml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: config file not found")
    try:
        return tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: not valid TOML ({e})") from None


def dumps_toml(data: dict) -> str:
    return tomli_w.dumps(strip_secrets(data))


def save_toml(data: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(dumps_toml(data), encoding="utf-8")


def parse_override(text: str) -> tuple[str, str, Any]:
    """`section.key=value` -> (section, key, value). Values are read as TOML values
    (numbers, booleans, lists, quoted strings); anything else is a plain string."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    dotted, raw = text.split("=", 1)
    section, key = dotted.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, key, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for text in overrides:
        section, key, value = parse_override(text)
        if section == "version":
            raise ConfigError("version: cannot be overridden")
        data.setdefault(section, {})
        if isinstance(data[section], dict):
            data[section][key] = value
    return data


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """TOML file (sparse or complete) + `--set` overrides -> validated config."""
    data = load_toml(path) if path else {}
    return from_dict(apply_overrides(data, overrides or []))
