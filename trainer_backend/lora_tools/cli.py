"""`python -m trainer_backend lora merge|mix|resize|extract|ema|inspect`: argv in, one JSON report out
(stdout); a refusal is one line on stderr naming the file, key and shapes, exit 2."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import ConfigError

LAYOUT_HELP = "LoRA key layout to write: auto (the input's, else the family's default), kohya or diffusers"


def add_parser(sub) -> None:
    lora = sub.add_parser("lora", help="LoRA tools: merge, mix, resize, extract, ema, inspect (docs/lora-tools.md)")
    tools = lora.add_subparsers(dest="lora_command", required=True)
    m = tools.add_parser("merge", help="bake LoRAs into the base: a diffusers folder and a single file")
    m.add_argument("--base", required=True, help="base model: diffusers folder, single file or builtin:tiny-<family>")
    m.add_argument("--lora", action="append", required=True, metavar="FILE[:WEIGHT]", help="repeatable")
    m.add_argument("--out", required=True, help="OUT/ (diffusers folder) and OUT.safetensors")
    x = tools.add_parser("mix", help="several LoRAs into one (ranks concatenated, or --rank R by SVD)")
    x.add_argument("loras", nargs="+", metavar="FILE:WEIGHT")
    x.add_argument("--base", required=True, help="the base model the LoRAs are for (every key is checked on it)")
    x.add_argument("--rank", type=int, default=0, help="re-factor to this rank (0 = concatenate, exact)")
    r = tools.add_parser("resize", help="SVD rank reduction: --rank R or --energy F per module")
    r.add_argument("lora", metavar="FILE")
    r.add_argument("--base", required=True)
    group = r.add_mutually_exclusive_group(required=True)
    group.add_argument("--rank", type=int, default=0)
    group.add_argument("--energy", type=float, default=0.0, help="keep this fraction of Σσ² per module, e.g. 0.99")
    e = tools.add_parser("extract", help="a LoRA from a full fine-tune (SVD of tuned − base; conv layers as LoCon)")
    e.add_argument("--base", required=True)
    e.add_argument("--tuned", required=True)
    e.add_argument("--rank", type=int, required=True)
    e.add_argument("--conv-rank", type=int, default=0, help="also convolutions (LoCon) at this rank; 0 = none")
    a = tools.add_parser("ema", help="post-hoc EMA over a run's checkpoints (Karras et al. 2024)")
    a.add_argument("--run", required=True, help="the run folder (its config.toml and checkpoints/)")
    a.add_argument("--sigma-rel", required=True, help="one value (0.1), several (0.05,0.1,0.2) or a range "
                                                        "0.05..0.2 (four values)")
    a.add_argument("--base", default="", help="base model (default: the run's model.path)")
    i = tools.add_parser("inspect", help="layout, family, ranks, alphas, size, metadata; --base: does it fit")
    i.add_argument("lora", metavar="FILE")
    i.add_argument("--base", default="")
    for p in (m, x, r, e, a):
        p.add_argument("--force", action="store_true", help="replace an existing output (never an input)")
    for p in (x, r, e, a):
        p.add_argument("--out", required=True, help="output .safetensors")
    for p in (x, r, e):
        p.add_argument("--layout", default="auto", help=LAYOUT_HELP)


def sigma_values(text: str) -> list[float]:
    """'0.1', '0.05,0.1' or the range '0.05..0.2' (four evenly spaced values)."""
    if ".." in text:
        lo, hi = (float(v) for v in text.split("..", 1))
        return [round(lo + (hi - lo) * k / 3, 6) for k in range(4)]
    return [float(v) for v in text.split(",") if v.strip()]


def run(args) -> int:
    from . import tools
    from .files import split_spec
    try:
        c = args.lora_command
        if c == "merge":
            report = tools.merge(args.base, [split_spec(s) for s in args.lora], Path(args.out), args.force)
        elif c == "mix":
            report = tools.mix(args.base, [split_spec(s) for s in args.loras], Path(args.out), args.rank,
                               args.layout, args.force)
        elif c == "resize":
            report = tools.resize(args.base, Path(args.lora), Path(args.out), args.rank, args.energy, args.layout,
                                  args.force)
        elif c == "extract":
            report = tools.extract(args.base, args.tuned, Path(args.out), args.rank, args.conv_rank, args.layout,
                                   args.force)
        elif c == "ema":
            report = tools.post_hoc_ema(Path(args.run), sigma_values(args.sigma_rel), Path(args.out), args.base,
                                        args.force)
        else:
            from .inspect_file import inspect
            report = inspect(Path(args.lora), args.base)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1, default=str))
    return 0
