"""Sample prompt lines (pure: the config's `samples.prompts` and `samples.prompt_file` hold them).

A line is kohya's syntax: `a photo of sks dog --n blurry --w 512 --h 768 --d 7 --s 28 --l 6`
(negative prompt, width, height, seed, steps, CFG scale), `--f 33` (a video family's frames, as musubi-tuner's
prompt files write it; rounded down to the family's frame rule), and `--control <image file>` for a family that
takes a control (reference) image (an edit model; repeated for each further reference image of a model that
takes several: `--control a.png --control b.png`); empty lines and `#` comments are skipped.
`config/rules.py` checks the inline lines, `config/checks.py` the file, `diffusion/sampling.py`
renders them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterator

from .base import ConfigError
from ..file_limits import read_text_capped
from .schema import TrainConfig

_OPTION = re.compile(r"\s+--([a-z]+)(?=\s|$)")
_OPTIONS = {"n": "negative", "w": "width", "h": "height", "d": "seed", "s": "steps", "l": "cfg_scale",
            "f": "frames", "control": "control"}


@dataclass(frozen=True)
class SamplePrompt:
    prompt: str
    negative: str = ""
    width: int = 512
    height: int = 512
    seed: int = 0
    steps: int = 20
    cfg_scale: float = 7.0
    control: str = ""          # the control (reference) image file, as written (config/paths.py resolves it)
    extra_controls: tuple[str, ...] = ()  # further reference images (--control repeated), as written
    frames: int = 0            # a video family's clip length (--f); 0 = the family's sample_frames

    @property
    def controls(self) -> tuple[str, ...]:
        return (self.control, *self.extra_controls) if self.control else ()


def parse_prompt_line(line: str, defaults: SamplePrompt) -> SamplePrompt:
    """One prompt line with kohya-style options -> SamplePrompt; ValueError names a bad option."""
    parts = _OPTION.split(" " + line.strip())
    prompt, values = parts[0].strip(), {}
    for name, raw in zip(parts[1::2], parts[2::2]):
        if name not in _OPTIONS:
            raise ValueError(f"unknown option --{name} (known: {', '.join('--' + k for k in _OPTIONS)})")
        field, raw = _OPTIONS[name], raw.strip()
        if field == "control" and not raw:
            raise ValueError("--control needs an image file")
        try:
            if field == "control" and "control" in values:  # a further reference image
                values["extra_controls"] = (*values.get("extra_controls", ()), raw)
            elif field in ("negative", "control"):
                values[field] = raw
            elif field == "cfg_scale":
                values[field] = float(raw)
            else:
                values[field] = int(raw)
        except ValueError:
            raise ValueError(f"--{name} needs a number, got {raw!r}") from None
    if values.get("frames", 1) < 1:
        raise ValueError(f"--f must be at least 1, got {values['frames']}")
    for side in ("width", "height"):
        if side in values:
            if values[side] < 8:
                raise ValueError(f"--{side[0]} must be at least 8, got {values[side]}")
            values[side] -= values[side] % 8  # the pipelines need multiples of 8
    if not prompt:
        raise ValueError("empty prompt")
    return replace(defaults, prompt=prompt, **values)


def _numbered(key: str, text: str) -> list[tuple[str, int, str]]:
    return [(key, i + 1, line) for i, line in enumerate(text.splitlines())
            if line.strip() and not line.lstrip().startswith("#")]


def defaults_of(cfg: TrainConfig) -> SamplePrompt:
    s = cfg.samples
    return SamplePrompt(prompt="", negative=s.negative_prompt, width=s.width or cfg.dataset.resolution,
                        height=s.height or cfg.dataset.resolution, steps=s.steps, cfg_scale=s.cfg_scale)


def line_problems(cfg: TrainConfig, key: str, text: str) -> Iterator[tuple[str, str]]:
    """(key, 'line N: what is wrong') for every line of `text` that does not parse."""
    for _, number, line in _numbered(key, text):
        try:
            parse_prompt_line(line, defaults_of(cfg))
        except ValueError as e:
            yield key, f"line {number}: {e}"


def control_line_problems(cfg: TrainConfig, key: str, text: str, mode: str | None,
                          arch: str) -> Iterator[tuple[str, str]]:
    """(key, 'line N: …') for lines whose control image does not fit the family: an edit model
    (Family.control_images == "required") needs `--control` on every line, a family that takes no
    control image (mode "") refuses it; mode None (model.arch = auto) checks nothing. Lines that do
    not parse are line_problems' to report."""
    if mode is None:
        return
    from ..families.registry import FAMILY_NAMES, entry  # pure (no torch)
    limit = entry(arch).max_control_images if arch in FAMILY_NAMES else 1
    start_image = arch in FAMILY_NAMES and entry(arch).takes_start_image  # image-to-video: one start image
    for _, number, line in _numbered(key, text):
        try:
            prompt = parse_prompt_line(line, defaults_of(cfg))
        except ValueError:
            continue
        if (mode or start_image) and len(prompt.controls) > limit:
            yield key, f"line {number}: {len(prompt.controls)} --control images: {arch} (model.arch) takes " + \
                ("one" if limit == 1 else f"at most {limit}")
        elif mode == "required" and not prompt.control:
            yield key, f"line {number}: {arch} (model.arch) is an edit model: add --control <image file> (the " \
                       f"image the prompt edits)"
        elif mode == "" and prompt.control and not start_image:
            yield key, f"line {number}: --control: {arch} (model.arch) takes no control image"


def prompt_lines(cfg: TrainConfig) -> list[tuple[str, int, str]]:
    """(config key, line number, text) of every prompt line, samples.prompts first."""
    out = _numbered("samples.prompts", cfg.samples.prompts)
    if cfg.samples.prompt_file:
        text = read_text_capped("samples.prompt_file", cfg.samples.prompt_file)  # regular files, size capped
        out += _numbered("samples.prompt_file", text)
    return out


def load_prompts(cfg: TrainConfig) -> list[SamplePrompt]:
    """All sample prompts with the [samples] defaults; prompt i defaults to seed samples.seed + i."""
    s, defaults = cfg.samples, defaults_of(cfg)
    prompts = []
    for i, (key, number, line) in enumerate(prompt_lines(cfg)):
        try:
            prompts.append(parse_prompt_line(line, replace(defaults, seed=s.seed + i)))
        except ValueError as e:
            raise ConfigError(f"{key}: line {number}: {e}") from None
    return prompts
