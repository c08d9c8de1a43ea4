"""The cases: what is measured, in which order, and how the list splits into device calls.

A case is one training process (ours or a diffusers example) on one model at one setting.
The catalogue is ordered by model (SD1.5, SDXL, Flux), so that `--part i/n` — contiguous parts,
balanced by estimated seconds including building each model a part needs — keeps the cases of a
model together and builds each full-size model once per call. Estimates are for an H100 and are
guesses until a GPU run replaces them (docs/gpu-bench.md); the runner also stops starting cases
when its own time budget runs out, so a wrong estimate costs cases, never the whole call.
Pure: no torch, no project imports (the plan prints on any machine).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

# model -> the family's tiny builtin name, the diffusers example, full resolution,
# seconds to build the random-weight model on the GPU (estimate), our attention targets
MODELS = {
    "sd15": dict(arch="sd1", example="train_dreambooth_lora.py", resolution=512, build_s=30,
                 targets=("to_q", "to_k", "to_v", "to_out.0")),
    "sdxl": dict(arch="sdxl", example="train_dreambooth_lora_sdxl.py", resolution=1024, build_s=60,
                 targets=("to_q", "to_k", "to_v", "to_out.0")),
    "flux": dict(arch="flux", example="train_dreambooth_lora_flux.py", resolution=1024, build_s=60,
                 targets=("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
                          "to_add_out")),
    # ours only (no diffusers example): the first measurement of each, peak memory against the planner
    "zimage": dict(arch="zimage", example=None, resolution=1024, build_s=45, disk_gib=20,
                   targets=("to_q", "to_k", "to_v", "to_out.0")),
    "qwen_image": dict(arch="qwen_image", example=None, resolution=1024, build_s=120, disk_gib=46,
                       targets=("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
                                "to_add_out")),
    "flux2_klein": dict(arch="flux2", example=None, resolution=1024, build_s=45, disk_gib=16,
                        targets=("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj",
                                 "to_add_out")),
}
DISK_GIB = {"sd15": 3, "sdxl": 8, "flux": 34}  # what a built model takes on the device's disk (64 GiB in all)
GC = ("precision.gradient_checkpointing=true",)
PRESETS = Path(__file__).resolve().parents[2] / "presets"
TIERS = ("12gb", "16gb", "24gb")
TINY_RESOLUTION, TINY_RANK = 64, 4


@dataclass(frozen=True)
class Case:
    group: str                 # what --cases selects
    trainer: str               # "ours" or "diffusers"
    variant: str               # "baseline", "gc", an option's name
    model: str                 # a MODELS key
    resolution: int
    method: str = "lora"       # "lora" or "full"
    batch: int = 1
    rank: int = 16
    precision: str = "bf16"
    sets: tuple[str, ...] = ()            # our `--set` overrides for this variant
    example_flags: tuple[str, ...] = ()   # extra flags for the diffusers example
    est_s: int = 60                       # planned seconds on the GPU, start to exit
    needs: tuple[str, ...] = ()           # modules the case imports (bitsandbytes, prodigyopt)
    count_flops: bool = True              # False under torch.compile (the counter cannot see inside)
    kind: str = "train"                   # "train", or "resume": stopped by SIGTERM, then resumed
    config: str = ""                      # a preset (path under the repo) the case trains with, under its sets
    planner: bool = False                 # also record the memory planner's peak for the same config
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def name(self) -> str:
        return f"{self.group}/{self.trainer}/{self.variant}"

    @property
    def flops_key(self) -> str:
        """Cases that do the same model arithmetic per step share their model FLOPs (report.py)."""
        return f"{self.model}:{self.method}:{self.resolution}:b{self.batch}:r{self.rank}"

    def option_keys(self) -> list[str]:
        return [s.split("=", 1)[0] for s in self.sets]


def _pair(group: str, model: str, variants: dict[str, tuple[tuple[str, ...], tuple[str, ...]]],
          est_s: int) -> list[Case]:
    """Ours and the diffusers example at each variant: (our sets, the example's flags)."""
    res = MODELS[model]["resolution"]
    return [Case(group, trainer, variant, model, res, sets=sets if trainer == "ours" else (),
                 example_flags=flags if trainer == "diffusers" else (), est_s=est_s)
            for variant, (sets, flags) in variants.items() for trainer in ("ours", "diffusers")]


def catalogue() -> list[Case]:
    """Every case, in run order (the full-size settings; `tiny()` shrinks them for the CPU)."""
    gc = ("--gradient_checkpointing",)
    both = {"baseline": ((), ()), "gc": (GC, gc)}
    out = _pair("sd15-lora", "sd15", both, 45)
    out.append(Case("sd15-fp16-resume", "ours", "fp16", "sd15", 512, precision="fp16", kind="resume", est_s=100,
                    notes=("trained with fp16 mixed precision, stopped by SIGTERM after a few steps, resumed",)))
    out += _pair("sdxl-lora", "sdxl", both, 75)
    options = {  # our options one at a time on top of the SDXL baseline
        "in-process-data": ("dataset.num_workers=0",),  # the baseline decodes in workers (automatic)
        # bf16 adapters stepped by torch's fused AdamW: what the examples train (bf16 LoRA weights, torch's AdamW)
        "bf16-fused-adamw": ("precision.full_bf16=true", 'precision.half_weights_rounding="nearest"',
                             "optimizer.fused=true"),
        "read-every-step": ("speed.host_read_every=1",),  # the old behaviour: the loss read after each step
        "channels-last": ("precision.channels_last=true",),
        **SPEED_OPTIONS,
    }
    out += option_cases("sdxl-options", "sdxl", options, (), 75)
    full = ("network.type=full", *GC)
    out += [Case("sdxl-full", "ours", "fp32-master", "sdxl", 1024, method="full", sets=full, est_s=150),
            Case("sdxl-full", "ours", "full-bf16", "sdxl", 1024, method="full",
                 sets=(*full, "precision.full_bf16=true"), est_s=150)]
    out += [Case("sdxl-optimizers", "ours", "adamw8bit", "sdxl", 1024, sets=("optimizer.name=adamw8bit",),
                 needs=("bitsandbytes",), est_s=75),
            Case("sdxl-optimizers", "ours", "prodigy", "sdxl", 1024, sets=("optimizer.name=prodigy", "optimizer.lr=1.0"),
                 needs=("prodigyopt",), est_s=75)]
    out += _pair("flux-lora", "flux", {"gc": (GC, gc)}, 90)
    out += option_cases("flux-options", "flux", SPEED_OPTIONS, GC, 100)
    out += first_sample_cases()
    out += tier_cases()
    return out


# issue 34: each speed option alone, then together, against the examples' same call (their flags unchanged)
ALL_OPTIONS = ("speed.compile=blocks", "dataset.cache_latents=true", "dataset.cache_text_encoder_outputs=true",
               "optimizer.fused=true")
CUDA_GRAPHS = ("speed.compile=blocks", "speed.compile_mode=reduce-overhead", "dataset.cache_latents=true")
SPEED_OPTIONS = {  # all together first: the headline figure comes before the budget runs out
    "all": ALL_OPTIONS,
    "all-cuda-graphs": (*ALL_OPTIONS, *CUDA_GRAPHS[1:]),
    "all-float8": (*ALL_OPTIONS, "model.quantize=float8_compute"),
    "compile": ("speed.compile=blocks",),
    "cuda-graphs": CUDA_GRAPHS,  # needs static shapes: cached latents, one bucket (the config rule)
    "cache-latents": ("dataset.cache_latents=true",),
    "auto-cache": ("dataset.cache_auto=true",),  # the trainer's default (the bench's baseline turns it off)
    "fused-adamw": ("optimizer.fused=true",),
    "float8-compute": ("model.quantize=float8_compute",),  # compute capability 8.9+ (H100/H200)
    "int8-compute": ("model.quantize=int8_compute",),
    "sdpa-flash": ("precision.attention=sdpa_flash",),
    "sdpa-cudnn": ("precision.attention=sdpa_cudnn_only",),
}


def option_cases(group: str, model: str, options: dict[str, tuple[str, ...]], base: tuple[str, ...],
                 est_s: int) -> list[Case]:
    """Ours with each option on top of the group's baseline sets; compiled cases take longer (the first
    step compiles) and count no FLOPs (the counter cannot see inside compiled code)."""
    res = MODELS[model]["resolution"]
    return [Case(group, "ours", variant, model, res, sets=tuple(dict.fromkeys((*base, *sets))),
                 est_s=est_s * 2 if "speed.compile=blocks" in sets else est_s,
                 count_flops="speed.compile=blocks" not in sets) for variant, sets in options.items()]


def first_sample_cases() -> list[Case]:
    """Z-Image, Qwen-Image and Flux.2 Klein 4B LoRA at 1024², batch 1, bf16, gradient checkpointing, text
    cached: the first it/s and peak memory of each, with the planner's peak for the same config."""
    out = []
    for model, est_s in (("zimage", 90), ("flux2_klein", 90), ("qwen_image", 150)):
        out.append(Case(f"{model.replace('_', '-')}-lora", "ours", "gc", model, MODELS[model]["resolution"],
                        sets=GC, est_s=est_s, planner=True, count_flops=False))
    return out


def _preset_arch(text: str) -> str:
    """model.arch of a sparse preset's TOML text (stdlib only: the plan prints on any machine)."""
    import tomllib
    return tomllib.loads(text).get("model", {}).get("arch", "")


def tier_cases(folder: Path = PRESETS) -> list[Case]:
    """Every 12/16/24 GB tier preset whose model the device can build: trained as the preset says (its own
    quantization, block swap, optimizer), at its resolution and batch; the measured peak against the
    planner's. The presets' cache-to-disk and bucketing stay; the bench's images are square."""
    arch_to_model = {spec["arch"]: m for m, spec in MODELS.items() if m != "flux2_klein"}
    out = []
    for path in sorted(folder.glob("*-*gb.toml")):
        tier = path.stem.rsplit("-", 1)[1]
        if tier not in TIERS:
            continue
        text = path.read_text(encoding="utf-8")
        arch = _preset_arch(text)
        model = "flux2_klein" if path.stem.startswith("flux2-klein-4b") else arch_to_model.get(arch)
        if model is None:
            continue  # no full-size builder (bench/gpubench/models.py): listed in docs/gpu-bench.md
        needs = tuple(m for m, words in (("bitsandbytes", ("nf4", "adamw8bit")), ("torchao", ('"int8"', '"float8"')))
                      if any(w in text for w in words))
        import tomllib
        resolution = tomllib.loads(text).get("dataset", {}).get("resolution", MODELS[model]["resolution"])
        out.append(Case("tiers", "ours", path.stem, model, resolution, config=f"presets/{path.name}",
                        est_s=120 if model in ("flux", "qwen_image") else 80, needs=needs, planner=True,
                        count_flops=False))
    order = list(MODELS)
    return sorted(out, key=lambda c: (order.index(c.model), c.variant))  # each model's builds together


def tiny(case: Case) -> Case:
    """The CPU version: the builtin tiny model at 64 px, rank 4, in fp32 (bf16 autocast is ~8× slower
    on a CPU without bf16 units, and fp16 needs a GPU); precision.full_bf16 keeps bf16 (it needs it)."""
    keeps_bf16 = "precision.full_bf16=true" in case.sets
    sets = case.sets
    if case.config and _preset(case.config).get("memory", {}).get("block_swap"):
        sets = (*sets, "memory.block_swap=1")  # a tiny denoiser has 2 blocks: swap one, the same code path
    return replace(case, resolution=TINY_RESOLUTION, rank=TINY_RANK, precision="bf16" if keeps_bf16 else "fp32",
                   est_s=60, sets=sets)


def _preset(config: str) -> dict:
    import tomllib
    return tomllib.loads((PRESETS.parent / config).read_text(encoding="utf-8"))


# Named selections for device calls of one command each (--budget-s 540), in the order of their value
# (docs/gpu-bench.md, "Device calls"); a name here expands to its groups and cases
SUITES = {
    "issue34-sdxl": ("sdxl-lora/ours/baseline", "sdxl-lora/diffusers/baseline", "sdxl-options/ours/all",
                     "sdxl-options/ours/all-cuda-graphs"),
    "issue34-flux": ("flux-lora/ours/gc", "flux-lora/diffusers/gc", "flux-options/ours/all",
                     "flux-options/ours/all-cuda-graphs"),
    "issue34-first-samples": ("zimage-lora", "flux2-klein-lora", "qwen-image-lora"),
    "issue34-sdxl-each": ("sdxl-lora/ours/baseline", "sdxl-lora/diffusers/baseline", "sdxl-options/ours/all-float8",
                          "sdxl-options/ours/compile", "sdxl-options/ours/cuda-graphs",
                          "sdxl-options/ours/float8-compute"),
}


def groups() -> list[str]:
    return list(dict.fromkeys(c.group for c in catalogue()))


def select(names: str = "", is_tiny: bool = False) -> list[Case]:
    """`--cases a,b`: suites (issue34-sdxl), groups (sdxl-lora) or single cases (sdxl-lora/ours/gc); empty = all."""
    wanted = [part for n in names.split(",") if n.strip() for part in SUITES.get(n.strip(), (n.strip(),))]
    known = {c.name for c in catalogue()} | set(groups())
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise SystemExit(f"--cases: unknown {', '.join(unknown)} (groups: {', '.join(groups())}; suites: "
                         f"{', '.join(SUITES)})")
    chosen = [c for c in catalogue() if not wanted or c.group in wanted or c.name in wanted]
    return [tiny(c) for c in chosen] if is_tiny else chosen


def part_cost(cases: list[Case], build_s: dict[str, int]) -> int:
    """Estimated seconds of one device call: its cases plus building each model it needs once."""
    return sum(c.est_s for c in cases) + sum(build_s[m] for m in dict.fromkeys(c.model for c in cases))


def split_parts(cases: list[Case], n: int, build_s: dict[str, int] | None = None) -> list[list[Case]]:
    """`cases` in order, cut into `n` contiguous parts (some may be empty when n > len(cases)) so that
    the most expensive part is as cheap as possible (dynamic programming over the cut points)."""
    if n < 1:
        raise ValueError("the number of parts must be at least 1")
    build_s = build_s if build_s is not None else {m: spec["build_s"] for m, spec in MODELS.items()}
    k = len(cases)
    inf = float("inf")
    # best[j][i]: the smallest possible largest cost when the first i cases form j parts; cut[j][i]: where part j starts
    best = [[inf] * (k + 1) for _ in range(n + 1)]
    cut = [[0] * (k + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for j in range(1, n + 1):
        for i in range(k + 1):
            for s in range(i + 1):
                if best[j - 1][s] == inf:
                    continue
                cost = max(best[j - 1][s], part_cost(cases[s:i], build_s))
                if cost < best[j][i]:
                    best[j][i], cut[j][i] = cost, s
    parts, i = [], k
    for j in range(n, 0, -1):
        s = cut[j][i]
        parts.append(cases[s:i])
        i = s
    return parts[::-1]


def parse_part(text: str) -> tuple[int, int]:
    """"2/4" -> (2, 4); "" -> (1, 1)."""
    if not text:
        return 1, 1
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SystemExit(f"--part: expected i/n such as 1/3, got {text!r}") from None
    if not 1 <= i <= n:
        raise SystemExit(f"--part: {text!r} is not one of 1/{n} … {n}/{n}")
    return i, n


def planned(args) -> list[Case]:
    chosen = select(args.cases, args.tiny)
    i, n = parse_part(args.part)
    return split_parts(chosen, n)[i - 1]


def print_plan(args) -> int:
    chosen = select(args.cases, args.tiny)
    _, n = parse_part(args.part)
    build_s = {m: spec["build_s"] for m, spec in MODELS.items()}
    for number, part in enumerate(split_parts(chosen, n), 1):
        if args.part and number != parse_part(args.part)[0]:
            continue
        print(f"part {number}/{n}: about {part_cost(part, build_s)} s "
              f"(models built: {', '.join(dict.fromkeys(c.model for c in part)) or 'none'})")
        for c in part:
            print(f"  {c.name:40s} {c.resolution}px b{c.batch} r{c.rank} {c.precision}  ~{c.est_s} s")
    return 0


def add_arguments(p) -> None:
    p.add_argument("--cases", default="", help=f"comma-separated suites, groups or cases; suites: {', '.join(SUITES)}; "
                                               f"groups: {', '.join(groups())}")
    p.add_argument("--part", default="", help="i/n: run the i-th of n contiguous, time-balanced parts")
    p.add_argument("--tiny", action="store_true", help="the builtin tiny models at 64 px (CPU check)")
