"""Section: [speed], options that make a step faster without changing what it computes (docs/performance.md).
The mechanisms live in training/compile.py and training/host_sync.py."""
from __future__ import annotations

from typing import ClassVar, Literal

from .base import F, Section
from .train_sections import DENOISER_METHODS


class Speed(Section):
    """Speed: compiled denoiser blocks, a step that does not wait on the host."""
    TAB: ClassVar[str] = "Precision & memory"
    WHEN: ClassVar[dict[str, tuple]] = {"network.type": DENOISER_METHODS}
    compile: Literal["off", "blocks"] = F(
        "off", "torch.compile the denoiser region by region: each of its repeated blocks (UNet down/mid/up "
               "blocks, transformer blocks) is compiled once, with the LoRA adapters inside, and blocks of the same "
               "kind and shape reuse one graph. The first step of each image size compiles (the log and the Run "
               "page show a 'compiling' phase; minutes for a full-size model); later steps run the compiled "
               "kernels. Compiled code is cached on disk (compile_cache_dir), so a restart or resume compiles "
               "much faster. Works with gradient checkpointing, resume and DDP; refused with memory.block_swap "
               "(swapped blocks change device between steps) and DeepSpeed/FSDP. See docs/performance.md.",
        resume="safe")
    compile_mode: Literal["default", "max-autotune-no-cudagraphs", "reduce-overhead"] = F(
        "default", "torch.compile's mode. default: fused kernels, quick to compile; max-autotune-no-cudagraphs: "
                   "also benchmarks matmul/convolution kernels at compile time (longer first step, sometimes "
                   "faster steps); reduce-overhead: CUDA graphs as well, replaying each block's recorded kernels with "
                   "one launch (refused unless shapes are static: dataset.bucketing off and latents cached; needs a "
                   "CUDA device; costs the graphs' own memory pool).", advanced=True, resume="safe", when={"speed.compile": ("blocks",)})
    compile_cache_dir: str = F(
        "", "Where compiled kernels are kept between runs; empty = ~/.cache/sd-studio/inductor (or "
            "$SD_STUDIO_CACHE/inductor).", widget="path", advanced=True, resume="ignored",
        when={"speed.compile": ("blocks",)})
    compile_max_graphs: int = F(
        8, "Most compiled graphs allowed per block kind (one per image-size bucket is normal). Past it the block "
           "runs uncompiled and the log says which shapes caused the recompilations.", ge=1, le=64, advanced=True,
        resume="safe", when={"speed.compile": ("blocks",)})
    host_read_every: int = F(
        0, "Read the step losses from the GPU every N optimizer steps, all at once, and check them for NaN/inf then "
           "(a checkpoint reads them first). Each read makes the host wait for the GPU, which costs most on steps "
           "bound by how fast Python queues kernels (LoRA, batch 1). Step events are still written for every "
           "logging.log_every step, up to N steps late. 0 = 1 on the CPU, 10 on a GPU.", ge=0, le=1000,
        advanced=True, resume="ignored")
    count_host_reads: bool = F(
        False, "Diagnostics: count the reads of tensor values by the host (.item(), float(), bool(), .tolist(), "
               "nonzero, boolean indexing: each one a wait for the GPU) inside every optimizer step, write the "
               "count into the step events (host_reads) and the call sites into the log. Slows the step a little.",
        advanced=True, resume="ignored")
