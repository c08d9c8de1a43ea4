"""Sections: hardware and processes, checkpoints, cloud sync, webhooks, logging."""
from __future__ import annotations

from typing import ClassVar, Literal

from ..run.contract import NOTIFIED
from .base import F, Section

NotifiedEvent = Literal[tuple(e.value for e in NOTIFIED)]  # the run contract's kinds a webhook may send

class Hardware(Section):
    """GPUs and processes."""
    TAB: ClassVar[str] = "GPUs"
    num_processes: int = F(1, "Processes (GPUs) on this machine.", ge=1, le=64, resume="safe")
    gpu_ids: str = F("all", "GPU ids to use, e.g. 0,1 or all.", pattern=r"^(all|\d+(,\d+)*)$", resume="safe")
    multi_gpu_policy: Literal["same_samples", "same_steps"] = F(
        "same_samples", "same_samples: N GPUs see as many samples as 1 GPU would; same_steps: same optimizer steps, "
                        "N times the samples.", resume="safe")
    keep_steps_per_epoch: bool = F(
        False, "same_samples only: instead of sharing each epoch across the GPUs, divide every subset's repeats by "
               "the number of processes (rounded, at least 1) and multiply the epochs: more, shorter epochs, the "
               "same samples in total.", advanced=True, resume="unsafe:samples")
    lr_scaling: Literal["none", "linear", "sqrt"] = F(
        "none", "Scale the learning rate with the effective batch relative to 1 GPU: linear (×N) or sqrt (×√N).",
        resume="safe")
    gpu_memory_gb: float = F(0.0, "GPU memory (GB) the memory planner checks the run against; 0 = the detected GPU "
                                  "(every common size 8–80 GB when none is detected). The plan shows the peak, "
                                  "a verdict and the options that would make the run fit (docs/memory.md).",
                             ge=0.0, le=1024.0, resume="ignored")
    cpu: bool = F(False, "Force the CPU even when a GPU is present (multi-process CPU uses gloo).", advanced=True,
                  resume="safe")
    strategy: Literal["ddp", "deepspeed", "fsdp"] = F(
        "ddp", "ddp: every GPU holds the whole model (best for LoRA); deepspeed: ZeRO sharding/offload; "
               "fsdp: PyTorch fully sharded data parallel (full fine-tunes of big models).", resume="safe")
    num_machines: int = F(1, "Machines (nodes) in a multi-node run; each runs num_processes processes.",
                          ge=1, le=1024, advanced=True, resume="safe")
    machine_rank: int = F(0, "This machine's rank in a multi-node run (0 = the main machine).", ge=0, le=1023,
                          advanced=True, resume="safe")
    main_process_ip: str = F("", "Multi-node: address of machine 0, reachable from every node.",
                             pattern=r"^[A-Za-z0-9.:_\-\[\]]*$", advanced=True, resume="safe")
    main_process_port: int = F(0, "Port of the main process; 0 = a free port on one machine (29500 when several "
                                  "machines, which must all use the same port).", ge=0, le=65535, advanced=True,
                                  resume="safe")
    deepspeed_zero_stage: int = F(2, "DeepSpeed ZeRO stage: 1 shards optimizer states, 2 also gradients, 3 also "
                                     "the parameters.", ge=1, le=3, advanced=True, resume="safe")
    deepspeed_offload_optimizer: bool = F(False, "DeepSpeed: keep optimizer states in CPU memory (slower, "
                                                 "saves GPU memory).", advanced=True, resume="safe")
    deepspeed_offload_params: bool = F(False, "DeepSpeed: keep parameters in CPU memory (ZeRO-3 only).",
                                       advanced=True, resume="safe")
    fsdp_sharding: Literal["full_shard", "shard_grad_op"] = F(
        "full_shard", "FSDP: full_shard shards parameters, gradients and optimizer states; shard_grad_op keeps "
                      "parameters whole between forward and backward (faster, more memory).", advanced=True,
                      resume="safe")
    fsdp_auto_wrap: Literal["transformer", "size", "none"] = F(
        "transformer", "FSDP: wrap each block named in fsdp_wrap_classes, blocks above fsdp_min_params, or the "
                       "whole model as one unit.", advanced=True, resume="safe")
    fsdp_wrap_classes: str = F("BasicTransformerBlock,ResnetBlock2D", "FSDP: module class names wrapped as units "
                               "(transformer auto-wrap).", pattern=r"^[A-Za-z_]\w*(,[A-Za-z_]\w*)*$", advanced=True,
                               resume="safe")
    fsdp_min_params: int = F(100_000_000, "FSDP: parameters per unit for size auto-wrap.", ge=1000, advanced=True,
                             resume="safe")
    fsdp_offload_params: bool = F(False, "FSDP: keep parameters and gradients in CPU memory.", advanced=True,
                                  resume="safe")
    ddp_gradient_as_bucket_view: bool = F(True, "DDP: gradients are views into the communication buckets (saves "
                                                "one gradient copy of memory).", advanced=True, resume="safe")
    ddp_static_graph: bool = F(False, "DDP: the set of used parameters never changes between steps (lets DDP "
                                      "optimize; wrong when it does change).", advanced=True, resume="safe")
    ddp_find_unused_parameters: bool = F(False, "DDP: search for parameters without gradients every step "
                                                "(needed only when some trainable modules are skipped; slower).",
                                         advanced=True, resume="safe")
    ddp_bucket_cap_mb: int = F(25, "DDP: gradient bucket size in MB.", ge=1, le=4096, advanced=True, resume="safe")
    collective_timeout_s: int = F(1800, "Seconds a process waits for the others (e.g. while the main process "
                                        "caches latents) before the run fails.", ge=60, le=86400, advanced=True,
                                        resume="safe")


class Checkpoints(Section):
    """Saving and resuming (see docs/checkpoints.md)."""
    TAB: ClassVar[str] = "Checkpoints & cloud"
    every_n_steps: int = F(0, "Save a checkpoint every N optimizer steps; 0 = off.", ge=0, resume="safe")
    every_n_epochs: int = F(0, "Save a checkpoint every N epochs (at the epoch's end); 0 = off.", ge=0, resume="safe")
    every_n_minutes: float = F(0.0, "Save a checkpoint when this many minutes passed since the last one; 0 = off.",
                               ge=0.0, resume="safe")
    keep_last: int = F(3, "Checkpoints kept locally (older ones are pruned).", ge=1, resume="safe")
    keep_every_n_steps: int = F(0, "Also save at every multiple of N steps and keep those checkpoints forever "
                                   "(e.g. 2000); 0 = off.", ge=0, advanced=True, resume="safe")
    keep_best: int = F(0, "Also keep the N checkpoints with the lowest best_metric; 0 = off.", ge=0, advanced=True,
                       resume="safe")
    best_metric: Literal["loss", "validation_loss"] = F(
        "loss", "Metric for keep_best (lower is better): loss = mean training loss since the previous checkpoint; "
                "validation_loss = the latest [validation] loss (needs validation turned on).", advanced=True,
                resume="safe")
    at_end: bool = F(True, "Save a final checkpoint, so a finished run can be continued with more epochs.",
                     advanced=True, resume="safe")
    export_at: Literal["none", "epochs", "checkpoints"] = F(
        "none", "Also write the LoRA file named with the step (<name>-step00000100.safetensors): at the checkpoints "
                "of every_n_epochs (epochs) or with every checkpoint (checkpoints).", resume="safe")
    resume: str = F("auto", "auto (newest valid checkpoint, local or in [cloud], else a fresh start), none, or a "
                            "checkpoint folder or s3://bucket/prefix/…/step-XXXXXXXX.", resume="ignored")


class Cloud(Section):
    """S3-compatible storage (AWS S3, Cloudflare R2, MinIO, …): checkpoints, outputs and samples are copied to
    s3://<bucket>/<prefix>/<output.name>/ in the background. Credentials come from the environment or
    secrets_file, never from this config."""
    TAB: ClassVar[str] = "Checkpoints & cloud"
    bucket: str = F("", "Bucket name; empty = no cloud sync.", pattern=r"^[A-Za-z0-9._-]*$", resume="ignored")
    prefix: str = F("", "Key prefix inside the bucket (the run goes under <prefix>/<output.name>/); no '.' or '..' "
                        "parts.", pattern=r"^([A-Za-z0-9_ -][A-Za-z0-9._ -]*(/[A-Za-z0-9_ -][A-Za-z0-9._ -]*)*/?)?$",
                    resume="ignored")
    endpoint_url: str = F("", "S3 endpoint for R2, MinIO, …; empty = AWS.", pattern=r"^(https?://\S+)?$",
                          resume="ignored")
    region: str = F("", "Region; empty = the environment's default (R2 uses auto).", resume="ignored")
    upload_checkpoints: bool = F(True, "Upload every checkpoint (its manifest last).", resume="ignored")
    upload_outputs: bool = F(True, "Upload the outputs, exported LoRA files and the run's config, events and log.",
                             resume="ignored")
    upload_samples: bool = F(True, "Upload sample images.", resume="ignored")
    keep_last: int = F(0, "Checkpoints kept in the bucket; 0 = as checkpoints.keep_last (keep_every_n_steps and "
                          "keep_best apply too).", ge=0, resume="ignored")
    secrets_file: str = F("", "File (mode 0600) of NAME=value lines holding the credentials named here and in "
                              "[webhooks]; the environment is searched first.", widget="path", resume="ignored")
    access_key_name: str = F("AWS_ACCESS_KEY_ID", "Name of the secret (environment variable or secrets_file line) "
                                                 "holding the access key id.", advanced=True, resume="ignored")
    secret_key_name: str = F("AWS_SECRET_ACCESS_KEY", "Name of the secret holding the secret access key.",
                             advanced=True, resume="ignored")
    addressing_style: Literal["auto", "path", "virtual"] = F(
        "auto", "URL style; auto = path style when endpoint_url is set (MinIO, R2), virtual hosts on AWS.",
        advanced=True, resume="ignored")
    multipart_mb: int = F(64, "Files above this size go up in parts of this size (multipart upload).", ge=5,
                          le=5000, advanced=True, resume="ignored")
    timeout_s: int = F(60, "Seconds one S3 request may take before it is retried (with backoff).", ge=1, le=3600,
                       advanced=True, resume="ignored")
    final_wait_s: int = F(600, "At the end of a run (or after a stop), wait at most this long for uploads.",
                          ge=0, le=86400, advanced=True, resume="ignored")


class WebhookTarget(Section):
    """One [[webhooks.targets]] entry."""
    url: str = F("", "http(s) URL. Discord URLs carry their token: leave this empty and use url_secret.",
                 pattern=r"^(https?://\S+)?$", resume="ignored")
    url_secret: str = F("", "Name of the secret (environment variable or cloud.secrets_file line) holding the URL.",
                        resume="ignored")
    format: Literal["json", "discord"] = F("json", "json: the payload as JSON; discord: a Discord message (sample "
                                                   "images attached).", resume="ignored")
    auth_secret: str = F("", "Name of the secret whose value is sent as the auth header (e.g. 'Bearer abc'); "
                             "empty = none.", resume="ignored")
    auth_header: str = F("Authorization", "Header that carries auth_secret.", pattern=r"^[A-Za-z0-9-]+$",
                         resume="ignored")
    events: list[NotifiedEvent] = F(
        [e.value for e in NOTIFIED], "Events sent.",
        resume="ignored")


class Webhooks(Section):
    """HTTP notifications at start, checkpoints, samples, epochs and the end; never slow training down."""
    TAB: ClassVar[str] = "Checkpoints & cloud"
    targets: list[WebhookTarget] = F([], "Webhook URLs, each a [[webhooks.targets]] table with url or url_secret, "
                                         "format, auth_secret, auth_header and events.", resume="ignored")
    timeout_s: float = F(5.0, "Seconds per request before it is abandoned.", gt=0.0, le=120.0, advanced=True,
                         resume="ignored")
    retries: int = F(2, "Retries of a failed request (with backoff).", ge=0, le=10, advanced=True, resume="ignored")


class Logging(Section):
    """Console, TensorBoard and events."""
    TAB: ClassVar[str] = "Logging"
    log_every: int = F(1, "Write a step event every N optimizer steps.", ge=1, advanced=True, resume="ignored")
    tensorboard: bool = F(True, "Write TensorBoard scalars to <run>/tb.", resume="ignored")
    tracker: Literal["none", "wandb"] = F(
        "none", "Experiment tracker besides TensorBoard: wandb = Weights & Biases through accelerate (needs the "
                "wandb package; loss, LR, epoch, samples, validation loss and the config without secrets).",
                resume="ignored")
    wandb_project: str = F("", "W&B project; empty = sd-studio.", pattern=r"^[A-Za-z0-9._ -]*$", resume="ignored")
    wandb_run_name: str = F("", "W&B run name; empty = output.name.", resume="ignored")
    wandb_entity: str = F("", "W&B entity (user or team); empty = your default entity.", advanced=True,
                          resume="ignored")
    wandb_mode: Literal["online", "offline"] = F(
        "online", "online: stream to W&B (needs an API key); offline: write the run under <run>/wandb and upload "
                  "it later with `wandb sync`.", resume="ignored")
    wandb_key_name: str = F("WANDB_API_KEY", "Name of the secret (environment variable or cloud.secrets_file line) "
                                             "holding the W&B API key; the key itself never goes in the config.",
                            pattern=r"^[A-Za-z0-9_.-]+$", advanced=True, resume="ignored")
