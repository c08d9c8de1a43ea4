"""A caption job's options, defined once: the CLI's flags, the argv the studio starts the job with,
and job.json are all derived from `CaptionOptions`' fields (pure: no torch)."""
from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from .prompts import LENGTHS, POLICIES, TARGETS

DEVICES_HELP = "auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda, cuda:1 …"


def _opt(default, help: str, choices: tuple = (), flag: str = "", **extra):
    return field(default=default, metadata={"help": help, "choices": choices, "flag": flag, **extra})


@dataclass(frozen=True)
class CaptionOptions:
    dataset: str = _opt("", "the dataset folder (its subfolders too; dot folders are skipped)", required=True)
    model: str = _opt("", "a captioner folder, a hub id (org/name[@revision]) or builtin:tiny-caption-<kind>",
                      required=True)
    job_dir: str = _opt("", "the job's folder (events, log, progress); default runs/caption-<dataset folder name>")
    target: str = _opt("auto", "natural sentences or booru tags (auto: tags for a tagger, else natural)",
                       ("auto", *TARGETS))
    length: str = _opt("short", "short or detailed captions", LENGTHS)
    trigger: str = _opt("", "a trigger word put first in every caption written")
    avoid: tuple[str, ...] = _opt((), "a word the captions must not contain (repeatable, or comma-separated)",
                                  multiple=True)
    prompt: str = _opt("", "your own instruction for a vision-language model (replaces the template)")
    max_words: int = _opt(0, "cut each caption to this many words (tags stay whole); 0: no limit")
    max_new_tokens: int = _opt(0, "tokens a model may generate per caption; 0: 96 short, 384 detailed")
    existing: str = _opt("skip", "an image that already has a caption: skip it (default), overwrite it, or append "
                                 "the new text after it (the previous text stays in the dataset's undo journal)",
                         POLICIES)
    image_side: int = _opt(1024, "images larger than this many pixels on their long side are scaled down first (the "
                                 "captioners see at most ~1 megapixel: Qwen-VL's tokens grow with the pixels); 0: "
                                 "as they are")
    caption_extension: str = _opt(".txt", "the caption files' extension")
    batch_size: int = _opt(4, "images per generate call")
    device: str = _opt("auto", DEVICES_HELP)
    dtype: str = _opt("auto", "weights' dtype (auto: bf16 on a GPU, fp32 on a CPU)", ("auto", "bf16", "fp16", "fp32"))
    quantize: str = _opt("none", "load the weights in 8 or 4 bits (bitsandbytes, CUDA only) to fit a small card",
                         ("none", "8bit", "4bit"))
    hub_token_name: str = _opt("", "for a gated or private hub repo: the environment variable that holds the token "
                                   "(the studio passes its secret so); default: huggingface_hub's own (HF_TOKEN or "
                                   "a saved login)")
    preview: int = _opt(0, "caption only this many images (4 when given without a number), print them and write "
                           "nothing", const=4)
    fresh: bool = _opt(False, "forget what an earlier start of this job did (default: continue where it stopped)")

    def resolved_job_dir(self) -> Path:
        if self.job_dir:
            return Path(self.job_dir).expanduser()
        name = re.sub(r"[^\w.-]+", "-", Path(self.dataset).expanduser().resolve().name).strip("-.") or "dataset"
        return Path("runs") / f"caption-{name}"   # a name the queue accepts too (letters, digits, . _ -)


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The caption command's flags, one per CaptionOptions field."""
    for f in dataclasses.fields(CaptionOptions):
        meta, kwargs = f.metadata, {"help": f.metadata["help"], "dest": f.name}
        if f.type in ("bool", bool):
            kwargs["action"] = "store_true"
        elif meta.get("multiple"):
            kwargs.update(action="append", default=[])
        else:
            kwargs["type"] = int if f.type in ("int", int) else str
            kwargs["default"] = f.default
            if meta.get("required"):
                kwargs["required"] = True
            if meta.get("choices"):
                kwargs["choices"] = list(meta["choices"])
            if "const" in meta:
                kwargs.update(nargs="?", const=meta["const"])
        parser.add_argument(_flag(f), **kwargs)


def from_namespace(ns: argparse.Namespace) -> CaptionOptions:
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(CaptionOptions)}
    values["avoid"] = tuple(w.strip() for item in values["avoid"] for w in item.split(",") if w.strip())
    return CaptionOptions(**values)


def to_argv(options: CaptionOptions) -> list[str]:
    """The flags that give `options` back through add_arguments (defaults left out)."""
    argv: list[str] = []
    for f in dataclasses.fields(CaptionOptions):
        value = getattr(options, f.name)
        if value == f.default and not f.metadata.get("required"):
            continue
        if isinstance(value, bool):
            argv.append(_flag(f))
        elif isinstance(value, tuple):
            for item in value:
                argv.append(f"{_flag(f)}={item}")
        else:
            argv.append(f"{_flag(f)}={value}")   # "=" keeps a value that starts with "-" a value
    return argv


def as_record(options: CaptionOptions) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(options).items()}
