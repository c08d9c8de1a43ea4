"""Sections: what is trained and how (network, optimizer, schedule, loss, precision, EMA, samples, validation, VAE)."""
from __future__ import annotations

from typing import ClassVar, Literal

from ..families.registry import AUDIO_FAMILIES, DDPM_FAMILIES, FLOW_FAMILIES
from .base import F, Section

FUSED_OPTIMIZERS = ("adamw", "sgd")  # torch.optim's with a fused implementation among optimizer.name's

ADAPTERS = ("lora", "loha", "lokr")  # network.type values that train adapters
DENOISER_METHODS = (*ADAPTERS, "full")  # network.type values that train the denoiser (not the VAE alone)


class Network(Section):
    """What is trained."""
    TAB: ClassVar[str] = "Network"
    type: Literal["lora", "loha", "lokr", "full", "vae"] = F(
        "lora", "lora / loha / lokr adapters (peft), or full fine-tuning of the UNet (and the text encoders with "
                "train_text_encoder). With class images this is DreamBooth (see docs/methods.md). vae: fine-tune "
                "the autoencoder on the dataset's images (see [vae]).", resume="unsafe:network")
    rank: int = F(16, "Adapter rank (dim).", ge=1, le=1024, resume="unsafe:shape",
                  when={"network.type": ADAPTERS})
    alpha: float = F(16.0, "Adapter alpha; the update is scaled by alpha/rank.", gt=0, resume="unsafe:scale",
                     when={"network.type": ADAPTERS})
    dropout: float = F(0.0, "Dropout on the adapter's input.", ge=0.0, lt=1.0, advanced=True, resume="safe",
                       when={"network.type": ADAPTERS})
    target_modules: list[str] = F(["to_q", "to_k", "to_v", "to_out.0"],
                                  "UNet module names that get adapters.", advanced=True, resume="unsafe:modules",
                                  when={"network.type": ADAPTERS})
    train_text_encoder: bool = F(False, "Also train adapters on the text encoder(s).", resume="unsafe:modules")
    text_encoder_lr: float = F(0.0, "Learning rate for text-encoder adapters; 0 = optimizer.lr.", ge=0.0,
                               advanced=True, resume="safe")
    text_encoder_target_modules: list[str] = F(["q_proj", "k_proj", "v_proj", "out_proj"],
                                               "Text-encoder module names that get adapters.", advanced=True,
                                               resume="unsafe:modules",
                                               when={"network.type": ADAPTERS})
    dora: bool = F(False, "LoRA only: weight-decomposed LoRA (DoRA). Saved in diffusers format (no kohya/webui "
                          "DoRA format is written).", resume="unsafe:adapters",
                   when={"network.type": ("lora",)})
    conv_rank: int = F(0, "Also put adapters on the UNet's convolutions (LoCon-style) with this rank; 0 = off.",
                       ge=0, le=1024, resume="unsafe:adapters",
                       when={"model.arch": DDPM_FAMILIES, "network.type": ADAPTERS})
    conv_alpha: float = F(1.0, "Alpha of the convolution adapters.", gt=0, resume="unsafe:scale",
                          when={"model.arch": DDPM_FAMILIES, "network.type": ADAPTERS})
    conv_target_modules: list[str] = F(["conv1", "conv2", "conv_shortcut", "downsamplers.0.conv",
                                        "upsamplers.0.conv"], "UNet convolution names that get adapters when "
                                       "conv_rank > 0.", advanced=True, resume="unsafe:adapters",
                                       when={"model.arch": DDPM_FAMILIES, "network.type": ADAPTERS})
    network_weights: str = F(
        "", "Start the adapters from an existing LoRA file instead of from scratch: this studio's own output, "
            "a kohya/webui file (SD3 and Flux too: lora_unet_joint_blocks_…/double_blocks_…, fused q/k/v split "
            "back) or a diffusers file for the model's family. Its shapes must match network.rank, "
            "conv_rank and the target modules (a mismatch is refused naming the first key); a different alpha "
            "is folded into the weights so the starting effect is the file's. A checkpoint being resumed takes "
            "precedence.", widget="path", resume="ignored", when={"network.type": ADAPTERS})
    training_adapter: str = F(
        "", "A frozen LoRA (\"training adapter\", \"de-distill\" LoRA, ai-toolkit's assistant LoRA) applied to the "
            "base during training steps only, for step-distilled models (Krea 2 Turbo, Z-Image Turbo): your LoRA "
            "learns the concept, not to undo the distillation. Samples and the saved LoRA are without it; never "
            "trained, saved or checkpointed. Any LoRA layout the family reads; a file that does not fit the model "
            "is refused naming the key. See docs/models.md.", widget="path", resume="safe",
        when={"network.type": ("lora",)})
    training_adapter_weight: float = F(1.0, "Strength of network.training_adapter during training steps.",
                                       gt=0, le=4, advanced=True, resume="safe", when={"network.type": ("lora",)})
    block_lr: dict[str, float] = F(
        {}, "Learning-rate multiplier per denoiser block, e.g. {\"IN*\" = 0.5, \"OUT03-05\" = 0, \"M*\" = 2}: "
            "keys are block names (UNets: IN00-IN11, M00-M02, OUT00-OUT11 as kohya/A1111 count them; Flux: "
            "double_00…, single_00…; SD3: joint_00…), a glob (*, ?) or a numbered range (OUT03-05); the last "
            "matching key wins, unmatched blocks keep 1. 0 freezes the block's adapters (they stay at their "
            "start: zero effect, or the network_weights values). See docs/methods.md.", widget="table",
        advanced=True, resume="safe", when={"network.type": ADAPTERS})
    exclude_modules: list[str] = F(
        [], "Denoiser module paths that get no adapter even when their name is in target_modules: regular "
            "expressions searched in the module path, e.g. \"^down_blocks\\.0\\.\" or "
            "\"single_transformer_blocks\\.(3[0-7])\\.\".", advanced=True, resume="unsafe:modules",
        when={"network.type": ADAPTERS})
    lokr_factor: int = F(-1, "LoKr: Kronecker factor of the weight's dimensions; -1 = as square as possible.",
                         ge=-1, le=1024, advanced=True, resume="unsafe:adapters",
                         when={"network.type": ("lokr",)})
    save_precision: Literal["fp32", "fp16", "bf16"] = F(
        "fp16", "Full fine-tune: precision of the saved diffusers folder and single-file checkpoint.", resume="safe",
                                                        when={"network.type": ("full",)})


class Optimizer(Section):
    """Optimizer and learning-rate schedule."""
    TAB: ClassVar[str] = "Optimizer & schedule"
    name: Literal["adamw", "adamw8bit", "paged_adamw8bit", "prodigy", "lion", "adafactor", "sgd"] = F(
        "adamw", "Optimizer. adamw8bit (bitsandbytes): AdamW with 8-bit states, ~1/4 of adamw's optimizer memory "
                 "(tensors under 4096 values keep 32-bit states); paged_adamw8bit: the same with its states in "
                 "paged memory that CUDA moves to system RAM when the GPU runs out (no OOM on spikes; on a CPU it "
                 "is adamw8bit). prodigy: learning-rate-free Adam (lr around 1.0); lion: sign updates, one state.",
        resume="unsafe:optimizer")
    lr: float = F(1e-4, "Learning rate.", gt=0.0, le=10.0, resume="safe")
    weight_decay: float = F(0.01, "Decoupled weight decay.", ge=0.0, advanced=True, resume="safe")
    beta1: float = F(0.9, "Adam beta1.", ge=0.0, lt=1.0, advanced=True, resume="safe")
    beta2: float = F(0.999, "Adam beta2.", ge=0.0, lt=1.0, advanced=True, resume="safe")
    eps: float = F(1e-8, "Adam epsilon.", gt=0.0, advanced=True, resume="safe")
    max_grad_norm: float = F(1.0, "Clip gradients to this norm; 0 = off.", ge=0.0, resume="safe")
    fused: bool = F(False, "adamw and sgd: PyTorch's fused kernel (a speed option; not fused_backward), which "
                           "updates a whole group of weights in one launch instead of several per chunk. The same "
                           "update up to floating-point rounding; on a GPU the optimizer step costs fewer kernel "
                           "launches (worth it for LoRA's many small weights). With precision.full_bf16 and "
                           "half_weights_rounding = nearest, adamw's fused kernel steps the bf16 weights (as the "
                           "diffusers examples train bf16 adapters); not with full_fp16. See docs/memory.md.",
                    advanced=True, resume="safe", when={"optimizer.name": FUSED_OPTIMIZERS})
    scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine", "cosine_with_restarts",
                       "polynomial"] = F("constant", "Learning-rate schedule.", resume="safe")
    warmup_steps: int = F(0, "Warmup optimizer steps.", ge=0, resume="safe")
    lr_cycles: int = F(1, "Cycles for cosine_with_restarts.", ge=1, advanced=True, resume="safe")
    fused_backward: bool = F(
        False, "Step the optimizer for each weight as soon as its gradient is ready during the backward pass, "
               "then free that gradient, so the whole model's gradients never exist at once (a full fine-tune "
               "saves about one copy of the trained weights). Exact: the same weights as the ordinary step. "
               "With adapters it works the same but saves little (their gradients are small). Needs "
               "schedule.grad_accum = 1 and optimizer.max_grad_norm = 0 (the global norm is known only after "
               "the whole backward), one process, no fp16 loss scaling, and a per-weight optimizer (not "
               "prodigy). The LR schedule, EMA, checkpoints and resume are unchanged. See docs/memory.md.",
        resume="safe")


class Schedule(Section):
    """Batching and length."""
    TAB: ClassVar[str] = "Optimizer & schedule"
    batch_size: int = F(1, "Batch size per GPU/process.", ge=1, le=4096, resume="unsafe:batch")
    grad_accum: int = F(1, "Gradient accumulation steps per optimizer step.", ge=1, le=4096, resume="safe")
    epochs: int = F(10, "Epochs (used when max_steps is 0).", ge=1, le=100000, resume="safe")
    max_steps: int = F(0, "Total optimizer steps; 0 = use epochs.", ge=0, le=10**9, resume="safe")
    seed: int = F(42, "Random seed (data order, noise, initial weights).", ge=0, resume="unsafe:order")


class Loss(Section):
    """Noise and loss shaping."""
    TAB: ClassVar[str] = "Optimizer & schedule"
    WHEN: ClassVar[dict[str, tuple]] = {"network.type": DENOISER_METHODS}  # VAE training has [vae] loss options
    masked: bool = F(False, "Masked loss: weight the loss per latent pixel by a mask (the image's alpha channel, or "
                            "dataset.mask_path), normalised by the mask's mean so the loss keeps its scale. White "
                            "trains, black is ignored. See docs/dataset.md.", resume="safe")
    noise_offset: float = F(0.0, "Noise offset (helps very dark/bright images).", ge=0.0, le=1.0, resume="safe")
    audio_loss_weight: float = F(1.0, "Models with an audio stream (LTX-2), clips with an audio track "
                                      "(dataset.video_audio): a sample's loss is its video term + this weight x its "
                                      "audio term (Lightricks' trainer adds the two: 1). 0 = the audio stream runs "
                                      "with the clip's audio but is not trained toward it.", ge=0.0, le=100.0,
                                 resume="safe", when={"model.arch": AUDIO_FAMILIES})
    audio_timestep: Literal["shared", "independent"] = F(
        "shared", "Models with an audio stream (LTX-2): the noise level of a clip's audio. shared = the video's "
                  "timestep (LTX2Pipeline denoises both streams on one sigma schedule); independent = drawn on its "
                  "own like the video's, shifted for the audio's token count (Lightricks' trainer draws each "
                  "stream's sigma separately).", advanced=True, resume="safe",
        when={"model.arch": AUDIO_FAMILIES})
    min_snr_gamma: float = F(0.0, "Min-SNR weighting gamma; 0 = off (5 is typical).", ge=0.0, resume="safe",
                             when={"model.arch": DDPM_FAMILIES})
    timestep_min: int = F(0, "Lowest training timestep.", ge=0, le=999, advanced=True, resume="safe")
    timestep_max: int = F(1000, "Highest training timestep (exclusive).", ge=1, le=1000, advanced=True, resume="safe")
    # flow-matching families (flux, sd3): how σ is drawn, shifted and weighted
    timestep_sampling: Literal["logit_normal", "uniform", "sigmoid", "mode"] = F(
        "logit_normal", "Flow-matching families (flux, sd3, zimage) only: the density σ is drawn from (SD3 paper; sigmoid = "
        "logit-normal with mean 0, std 1).", advanced=True, resume="safe",
                                                                                 when={"model.arch": FLOW_FAMILIES})
    logit_mean: float = F(0.0, "Flow-matching families only: mean of the logit-normal density.", ge=-10.0, le=10.0,
                          advanced=True, resume="safe",
                          when={"model.arch": FLOW_FAMILIES, "loss.timestep_sampling": ("logit_normal",)})
    logit_std: float = F(1.0, "Flow-matching families only: std of the logit-normal density.", gt=0.0, le=10.0,
                         advanced=True, resume="safe",
                         when={"model.arch": FLOW_FAMILIES, "loss.timestep_sampling": ("logit_normal",)})
    mode_scale: float = F(1.29, "Flow-matching families only: scale of the mode density.", ge=0.0, le=10.0,
                          advanced=True, resume="safe",
                          when={"model.arch": FLOW_FAMILIES, "loss.timestep_sampling": ("mode",)})
    flow_shift: float = F(0.0, "Flow-matching families only: timestep shift; 0 = the family's own (sd3, zimage: 3.0; flux, chroma: "
                               "resolution-dependent, as its scheduler samples).", ge=0.0, le=100.0, advanced=True,
                               resume="safe",
                          when={"model.arch": FLOW_FAMILIES})
    flow_weighting: Literal["none", "sigma_sqrt", "cosmap"] = F(
        "none", "Flow-matching families only: per-sample loss weighting (SD3 paper).", advanced=True, resume="safe",
                                                                when={"model.arch": FLOW_FAMILIES})


class Precision(Section):
    """Precision and memory."""
    TAB: ClassVar[str] = "Precision & memory"
    mixed: Literal["no", "fp16", "bf16"] = F("bf16", "Mixed precision; frozen weights in this dtype, trainable in "
                                                     "fp32.",
                                             resume="safe")
    gradient_checkpointing: bool = F(False, "Recompute activations in backward to save memory.", resume="safe")
    attention: Literal["sdpa", "sdpa_cudnn", "default", "flash_attn3", "flash_attn2", "sdpa_flash", "sdpa_efficient",
                       "sdpa_cudnn_only"] = F(
        "sdpa", "Attention kernel. sdpa: PyTorch's scaled_dot_product_attention with its flash, memory-efficient "
                "and math kernels but not cuDNN's (on an H200 with torch 2.11, cuDNN's kernel, PyTorch's first "
                "choice there, turned a full-size Flux.1 LoRA's loss to NaN at step 2; without it the same run "
                "trained cleanly); sdpa_cudnn: PyTorch's own choice, cuDNN included; default: the plain attention "
                "(slowest, most memory). One kernel, checked once per attention shape against the math kernel (forward "
                "and backward, random inputs) before it is used, falling back to sdpa's choice with one log line "
                "where it fails or cannot run: flash_attn3 / flash_attn2: FlashAttention 3 (Hopper) or 2 (Ampere+), "
                "only if the flash_attn_interface / flash_attn package is installed (not a dependency); "
                "sdpa_flash, sdpa_efficient, sdpa_cudnn_only: that SDPA kernel alone.", advanced=True, resume="safe")
    full_bf16: bool = F(False, "Keep the trained weights themselves in bf16, with no fp32 master copy (weights, "
                               "gradients and optimizer state take about half the memory; what made full fine-tunes "
                               "and DreamBooth fit on 24 GB cards). Needs mixed = bf16. Meant for network.type = "
                               "full; see half_weights_rounding.", advanced=True, resume="safe")
    full_fp16: bool = F(False, "Like full_bf16 in fp16 (needs mixed = fp16). fp16's narrow range overflows more "
                               "easily than bf16: prefer full_bf16 where the GPU supports bf16.", advanced=True,
                               resume="safe")
    half_weights_rounding: Literal["stochastic", "kahan", "nearest"] = F(
        "stochastic", "With full_bf16/full_fp16 and the adamw or sgd optimizer: how each update is written into "
                      "the half-precision weights. stochastic: randomly rounded up or down in proportion, so small "
                      "updates survive on average (no extra memory); kahan: a compensation buffer keeps the rounding "
                      "error (2 more bytes per weight, the most exact); nearest: plain rounding (updates below the "
                      "weight's precision are lost).", advanced=True, resume="safe")


class Ema(Section):
    """Exponential moving average of the trained weights (full fine-tune or adapters)."""
    TAB: ClassVar[str] = "Network"
    WHEN: ClassVar[dict[str, tuple]] = {"network.type": DENOISER_METHODS}
    enabled: bool = F(False, "Keep an EMA copy of the trainable weights.", resume="safe")
    decay: float = F(0.999, "EMA decay per optimizer step (0.999 averages over roughly the last 1000 steps).",
                     gt=0.0, lt=1.0, resume="safe")
    every_n_steps: int = F(1, "Update the EMA every N optimizer steps (decay^N per update, so the average spans "
                              "the same steps; saves time when the EMA is on the CPU).", ge=1, le=100000, resume="safe")
    device: Literal["cpu", "accelerator"] = F("cpu", "cpu: EMA weights in system RAM (saves GPU memory); "
                                                     "accelerator: next to the weights (faster updates).",
                                                     resume="safe")
    use_for_samples: bool = F(True, "Generate sample images with the EMA weights.", resume="safe")
    use_for_output: bool = F(True, "Save the EMA weights as the final output (checkpoints always hold both).",
                             resume="safe")


class Samples(Section):
    """Sample images during training."""
    TAB: ClassVar[str] = "Samples"
    WHEN: ClassVar[dict[str, tuple]] = {"network.type": DENOISER_METHODS}  # a VAE alone has nothing to sample with
    prompts: str = F("", "One prompt per line. Options after the prompt, kohya style: --n negative prompt, "
                         "--w width, --h height, --d seed, --s steps, --l CFG scale; --control <image file> for "
                         "edit models (the prompt's control image; repeated for each reference image of a model that "
                         "takes several, e.g. Qwen-Image-Edit-2509/2511). Lines starting with # are ignored.", widget="textarea", resume="safe")
    prompt_file: str = F("", "Text file with more prompts, same format (used after samples.prompts).",
                         widget="path", resume="safe")
    every_n_steps: int = F(0, "Sample every N optimizer steps; 0 = off.", ge=0, resume="safe")
    every_n_epochs: int = F(0, "Sample at the end of every N-th epoch; 0 = off.", ge=0, resume="safe")
    before_first_step: bool = F(False, "Also sample once before training starts (the untrained model).", resume="safe")
    width: int = F(0, "Default width; 0 = dataset.resolution.", ge=0, le=4096, multiple_of=8, resume="safe")
    height: int = F(0, "Default height; 0 = dataset.resolution.", ge=0, le=4096, multiple_of=8, resume="safe")
    steps: int = F(20, "Default sampling steps.", ge=1, le=1000, resume="safe")
    cfg_scale: float = F(7.0, "Default classifier-free guidance scale.", ge=0.0, le=50.0, resume="safe")
    seed: int = F(1234, "Seed of the first prompt; prompt i uses seed + i unless its line sets --d.", ge=0,
                  resume="safe")
    negative_prompt: str = F("", "Default negative prompt.", resume="safe")
    scheduler: Literal["euler", "euler_a", "ddim", "dpmpp_2m", "pndm", "unipc", "ddpm", "default"] = F(
        "euler", "Sampler; default = the model's own scheduler.", advanced=True, resume="safe")
    check_adapter_effect: bool = F(True, "Measure the adapter's effect at each sample round and at the end (the same "
                                         "prompt and seed drawn without the adapter too; the base image is drawn once "
                                         "per prompt): a LoRA that barely changes the output, NaN weights or a flat "
                                         "black sample become a warning in the Run page, the events and the webhooks. "
                                         "With no prompts the end's check draws the first training caption.",
                                   advanced=True, resume="safe")


class Validation(Section):
    """Validation loss on held-out images at fixed timesteps and noise, comparable across evaluations
    (off by default; costs nothing when off). The images: validation.path, else the ones held out by
    validation.fraction or dataset.validation_every_nth."""
    TAB: ClassVar[str] = "Samples"
    every_n_steps: int = F(0, "Compute the validation loss every N optimizer steps; 0 = off.", ge=0, resume="safe")
    every_n_epochs: int = F(0, "Compute the validation loss at the end of every N-th epoch; 0 = off.", ge=0,
                            resume="safe")
    path: str = F("", "A separate folder of validation images with captions; empty = hold images out of the "
                      "dataset (fraction or dataset.validation_every_nth).", widget="path", resume="safe")
    fraction: float = F(0.0, "Hold out this fraction of the dataset's images (spread evenly, in sorted order) for "
                             "validation; 0 = off.", ge=0.0, lt=1.0, resume="safe")
    timesteps: int = F(4, "Fixed timesteps per image, evenly spread over the training range: more gives a "
                          "steadier loss at proportional cost.", ge=1, le=100, advanced=True, resume="safe")
    batch_size: int = F(0, "Validation batch size; 0 = schedule.batch_size.", ge=0, le=4096, advanced=True,
                        resume="safe")


class Vae(Section):
    """Autoencoder (VAE) fine-tuning, with network.type = vae: reconstruct the dataset's images."""
    TAB: ClassVar[str] = "Network"
    WHEN: ClassVar[dict[str, tuple]] = {"network.type": ("vae",)}
    loss: Literal["l1", "mse"] = F("l1", "Reconstruction loss on pixels: l1 keeps edges sharper, mse penalises "
                                         "large errors more (no perceptual loss: it needs pretrained weights).",
                                         resume="safe")
    kl_weight: float = F(1e-6, "Weight of the KL term that keeps the latents close to a unit Gaussian (encoder "
                               "training only).", ge=0.0, le=1.0, resume="safe")
    decoder_only: bool = F(True, "Train only the decoder. The encoder, and so the latent space, stays as it was: "
                                 "LoRAs and checkpoints trained on the base VAE's latents keep working.", resume="safe")
    precision: Literal["fp32", "bf16", "fp16"] = F(
        "fp32", "Training precision (precision.mixed does not apply). fp32 is the safe default; fp16 is refused: "
                "the VAE's activations overflow fp16 and the loss turns NaN.", resume="safe")
    save_precision: Literal["fp32", "fp16", "bf16"] = F("fp32", "Precision of the saved VAE folder and file.",
                                                        resume="safe")
