"""Section: [memory], where the model's parts live between uses (block swap, offloaded encoders).
The mechanism is training/block_swap.py; docs/memory.md explains both options."""
from __future__ import annotations

from typing import ClassVar

from .base import F, Section
from .train_sections import DENOISER_METHODS


class Memory(Section):
    """Where the model's parts live between uses: fewer blocks on the GPU, encoders in system RAM."""
    TAB: ClassVar[str] = "Precision & memory"
    WHEN: ClassVar[dict[str, tuple]] = {"network.type": DENOISER_METHODS}  # a VAE run trains the VAE alone
    block_swap: int = F(
        0, "Keep this many of the denoiser's blocks (the last N transformer blocks, or UNet down/mid/up blocks) "
           "in CPU memory and stream each to the GPU just before it runs, forward and backward, on a side "
           "stream while the previous block computes; 0 = off. Saves about N blocks' weights of GPU memory "
           "and costs PCIe transfers each step. Trained weights inside swapped blocks travel with them (for a "
           "full fine-tune use optimizer.fused_backward so the step runs on the GPU). Use it with "
           "precision.gradient_checkpointing: without it autograd keeps the swapped blocks' weights on the GPU "
           "until the backward and the peak does not fall (SDXL on an H200: 0.558x with, 1.032x without). "
           "A quantized base (model.quantize) swaps at its quantized size. One process only. See docs/memory.md.",
        ge=0, le=1000, resume="safe")
    offload_encoders: bool = F(
        False, "Keep the frozen text encoders and the VAE in CPU memory and move each part to the GPU only "
               "while it runs (text encoders being trained stay on the GPU). Saves their GPU memory for the "
               "denoiser; costs a transfer each use (nothing per step with dataset.cache_latents and "
               "cache_text_encoder_outputs).", resume="safe")
