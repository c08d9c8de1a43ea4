"""A caption job: its own process (`python -m trainer_backend caption …`), a run-style folder, and
the dataset's captions written through the workbench's undo journal.

    <job_dir>/  .sd-studio-run  job.json (the options)  events.jsonl  train.log  captioned.jsonl
                control/stop    preview.json

events.jsonl uses the run contract's kinds, so the studio's run machinery reads it as it reads a
training run: `start` (step = images done, total_steps = images in the job), `step` after each
batch (it_per_s = images per second, eta_s), then `done`, `stopped` (control/stop or SIGTERM: the
batch in hand is finished and written first; exit 75) or `error`. A second start continues: the
ledger (captioned.jsonl) lists what this job already captioned. One batch = one undoable journal
entry. A corrupt image is skipped with one line in the log; the job goes on.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from ..errors import ConfigError
from ..run import exitcodes
from ..run.contract import CONTROL_DIR, Control, Event
from .kinds import CaptionerKind, detect_kind
from .options import CaptionOptions, as_record
from .prompts import DEFAULT_NEW_TOKENS, finish, instruction, merged
from .worklist import LEDGER, WorkItem, append_ledger, read_ledger, worklist

LOG = logging.getLogger("trainer")
JOB_FILE = "job.json"
PREVIEW_FILE = "preview.json"
MAX_PIXELS = 100_000_000


# a hub captioner comes in two steps: its small files tell the kind, then only that kind's files
HUB_FIRST = ["*.json", "*.csv"]
HUB_FILES = {"tagger": ["model.onnx", "selected_tags.csv", "*.json"],   # not the timm copy beside it
             "transformers": ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]}


def resolve_model(spec: str, events=None, token_name: str = "") -> Path:
    """--model as a folder: builtin:tiny-caption-<kind>, a local folder, or a hub id (downloaded into
    the Hugging Face cache by model_sources, its progress in the log and as `download` events of the
    job's `events`; later starts read the cache)."""
    from .tiny import resolve_builtin
    builtin = resolve_builtin(spec)
    if builtin is not None:
        return builtin
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise ConfigError(f"--model: {spec} is a file; a captioner is a folder (config.json and weights, or "
                          f"model.onnx and selected_tags.csv)")
    try:
        from ..model_sources import parse_hub_spec, to_events
        from ..model_sources import resolve_model as from_hub
        from ..model_sources.progress import both, logged
    except ImportError:
        raise ConfigError(f"--model: {spec} is not a folder (hub downloads are not available here)") from None
    if parse_hub_spec(spec) is None:
        raise ConfigError(f"--model: {spec} is neither a folder nor a hub repo id (org/name or org/name@revision)")
    token = None
    if token_name:   # never in argv, a log or job.json: only the variable's name travels
        from ..remote.secrets import Secrets, mask_in_logs
        token = Secrets({}).require(token_name, "--hub-token-name")
        mask_in_logs({token})
    progress = both(logged(LOG), to_events(events.emit) if events is not None else None)
    fetch = dict(progress=progress, key="--model", kind="files", token=token)
    first = from_hub(spec, allow_patterns=HUB_FIRST, **fetch)
    files = HUB_FILES["tagger" if (Path(first) / "selected_tags.csv").is_file() else "transformers"]
    return Path(from_hub(spec, allow_patterns=files, **fetch))


def hold_back_unused(folder: Path, quantize: str) -> list[str]:
    """Mark torchao (no captioner uses it) and bitsandbytes (unless --quantize or a folder saved quantized
    asks for it) unavailable before transformers imports them: their import alone fills the log with
    kernel warnings (as training/optional_backends.py does for a training run)."""
    try:
        saved_quantized = "quantization_config" in (folder / "config.json").read_text(encoding="utf-8")
    except OSError:
        saved_quantized = False
    held = ["torchao"] + ([] if quantize != "none" or saved_quantized else ["bitsandbytes"])
    held = [name for name in held if name not in sys.modules]
    for name in held:
        sys.modules[name] = None   # type: ignore[assignment]  # Python's marker for "not importable"
    return held


def check_options(options: CaptionOptions, kind: CaptionerKind) -> str:
    """The effective target; ConfigError naming the flag for options the captioner cannot honour."""
    target = options.target if options.target != "auto" else kind.targets[0]   # its first: its default
    if target not in kind.targets:
        raise ConfigError(f"--target {target}: {kind.label} writes {' or '.join(kind.targets)} only; "
                          f"choose another --target or another captioner")
    if options.prompt and kind.name in ("florence2", "wd14"):
        raise ConfigError(f"--prompt: {kind.label} takes no free-text instruction (Florence-2 has task tokens, "
                          f"the tagger none); use --length")
    if options.image_side and options.image_side < 64:
        raise ConfigError(f"--image-side: {options.image_side} pixels is too small to caption; at least 64 (0: as they are)")
    if options.batch_size < 1:
        raise ConfigError(f"--batch-size: must be ≥ 1, got {options.batch_size}")
    for flag, value in (("--max-words", options.max_words), ("--max-new-tokens", options.max_new_tokens),
                        ("--preview", options.preview)):
        if value < 0:
            raise ConfigError(f"{flag}: must be ≥ 0, got {value}")
    if not options.caption_extension.startswith(".") or "/" in options.caption_extension:
        raise ConfigError(f"--caption-extension: {options.caption_extension!r} must look like .txt")
    return target


class Captioner:
    """One interface over the vision-language models and the tagger: PIL images in, raw text out."""

    def __init__(self, folder: Path, kind: CaptionerKind, options: CaptionOptions, target: str):
        self.kind, self.length = kind, options.length
        self.instruction = instruction(kind.name, target, options.length, options.avoid, options.prompt)
        self.max_new_tokens = options.max_new_tokens or DEFAULT_NEW_TOKENS[options.length]
        if kind.name == "wd14":
            from .tagger import OnnxTagger
            self.model = OnnxTagger(folder, options.device)
        else:
            from .vlm import VisionLanguageCaptioner
            self.model = VisionLanguageCaptioner(folder, kind, options.device, options.dtype, options.quantize)

    def __call__(self, images: list) -> list[str]:
        if self.kind.name == "wd14":
            return self.model.caption(images, self.length)
        return self.model.caption(images, self.instruction, self.max_new_tokens)


def _load_images(items: list[WorkItem], side: int = 0) -> tuple[list[WorkItem], list]:
    """The batch's images as RGB, scaled down to `side` on their long side (0: as they are)."""
    from PIL import Image
    from ..data.images import BadImage, load_rgb
    kept, images = [], []
    for item in items:
        try:
            image = load_rgb(item.image, MAX_PIXELS, draft=(side, side) if side else None)
            if side and max(image.size) > side:
                image.thumbnail((side, side), Image.LANCZOS)
            images.append(image)
            kept.append(item)
        except BadImage as e:
            LOG.warning("skipped %s: %s", item.rel, e)
    return kept, images


def _write(dataset: Path, changes: dict[Path, str], expected: dict[Path, str | None], label: str) -> dict[Path, str]:
    """Write through the undo journal, one entry per batch; a file that changed meanwhile (another
    program saved it) is left alone with a line in the log. Returns {caption file: entry id}."""
    from ..workbench import JournalError, apply
    if not changes:
        return {}
    try:
        entry = apply(dataset, changes, label, expected=expected)
        return {path: entry for path in changes}
    except JournalError:
        written = {}
        for path, text in changes.items():   # one by one: keep what can be written
            try:
                written[path] = apply(dataset, {path: text}, label, expected={path: expected[path]})
            except JournalError as e:
                LOG.warning("kept %s as it is: %s", path.relative_to(dataset), e)
        return written


class CaptionJob:
    def __init__(self, options: CaptionOptions, own_process: bool = False):
        self.options, self.own_process = options, own_process
        self.dataset = Path(options.dataset).expanduser().resolve()
        self.job_dir = options.resolved_job_dir().resolve()
        if not self.dataset.is_dir():
            raise ConfigError(f"--dataset: {options.dataset} is not a folder")
        if self.job_dir == self.dataset or self.job_dir.is_relative_to(self.dataset):
            raise ConfigError(f"--job-dir: {self.job_dir} is inside the dataset; the job writes its folder elsewhere")

    def stop_wanted(self, signals) -> bool:
        return signals.stop_requested or (self.job_dir / CONTROL_DIR / Control.STOP.value).exists()

    def lock(self):
        """The job folder's lock (run/run_lock.py: one process per folder); ConfigError naming --job-dir."""
        from ..run.run_folder import RunFolderError
        from ..run.run_lock import RunLocked, acquire, describe
        try:
            return acquire(self.job_dir, by="caption job", argv=sys.argv)
        except RunLocked as e:
            raise ConfigError(f"--job-dir: the caption job in {self.job_dir} is already running ({describe(e.holder)}); "
                              f"stop it first, or choose another --job-dir") from None
        except RunFolderError as e:   # its message names the training option: name the flag instead
            text = str(e).split(": ", 1)[-1].replace("output.name or output.dir", "--job-dir")
            raise ConfigError("--job-dir: " + text.replace("output.name", "--job-dir").replace("output.dir", "--job-dir")
                              ) from None

    def run(self) -> int:
        with self.lock():
            return self._run()

    def _run(self) -> int:
        from ..run.events import RunEvents, setup_logging
        from ..run.stop_signals import StartupStop, StopSignals, stop_outside_the_loop
        (self.job_dir / CONTROL_DIR / Control.STOP.value).unlink(missing_ok=True)   # an earlier Stop's mark
        setup_logging(self.job_dir, True)
        events = RunEvents(self.job_dir, tensorboard=False)
        try:
            with stop_outside_the_loop():
                pending, already = self._pending()
                if not pending and not self.options.preview:
                    events.emit(Event.START, step=already, total_steps=already)
                    events.emit(Event.DONE, step=already, outputs=[], elapsed_s=0.0)
                    LOG.info("nothing to caption: every image has a caption or was captioned by this job "
                             "(--existing overwrite/append redoes captioned images, --fresh forgets this job's)")
                    return exitcodes.OK
                captioner, target = self._load(events)
            signals = StopSignals(self.job_dir)
            try:
                return self._loop(events, signals, captioner, pending, already, target)
            finally:
                signals.restore()
        except StartupStop as stop:
            user = (self.job_dir / CONTROL_DIR / Control.STOP.value).exists()
            events.emit(Event.STOPPED if user else Event.PREEMPTED, step=0, outside_training=True)
            LOG.info("stopped before captioning began (signal %s)", stop.signum)
            return exitcodes.STOPPED_SAVED
        except ConfigError as e:
            events.emit(Event.ERROR, message=str(e))
            raise
        except Exception as e:
            LOG.exception("the caption job failed")
            message = f"{type(e).__name__}: {e}".splitlines()[0]
            if "out of memory" in message.lower():
                message += " (a smaller --batch-size or --image-side, or --quantize 4bit, needs less)"
            events.emit(Event.ERROR, message=message)
            print(f"error: {message}", file=sys.stderr)
            return exitcodes.ERROR
        finally:
            events.close()

    def _pending(self) -> tuple[list[WorkItem], int]:
        options = self.options
        if options.fresh:
            (self.job_dir / LEDGER).unlink(missing_ok=True)
        pending, already = worklist(self.dataset, options.caption_extension, options.existing,
                                    read_ledger(self.job_dir))
        if options.preview:
            return pending[:options.preview], 0
        (self.job_dir / JOB_FILE).write_text(json.dumps(as_record(options), indent=1), encoding="utf-8")
        LOG.info("%d images to caption in %s (%d done by this job before)", len(pending), self.dataset, already)
        return pending, already

    def _load(self, events) -> tuple[Captioner, str]:
        options = self.options
        folder = resolve_model(options.model, events, options.hub_token_name)
        kind = detect_kind(folder)
        if self.own_process:   # never in a caller's process (tests, the bench), which may need them later
            hold_back_unused(folder, options.quantize)
        target = check_options(options, kind)
        LOG.info("loading %s (%s) from %s", options.model, kind.label, folder)
        return Captioner(folder, kind, options, target), target

    def _loop(self, events, signals, captioner: Captioner, pending: list[WorkItem], already: int, target: str) -> int:
        options, total = self.options, already + len(pending)
        if options.preview:
            return self._preview(captioner, pending, target)
        label = f"captions: {options.model} ({self.job_dir.name})"
        events.emit(Event.START, step=already, total_steps=total)
        started, done_now, written_files, unreadable = time.monotonic(), 0, 0, 0
        for first in range(0, len(pending), options.batch_size):
            if self.stop_wanted(signals):
                user = (self.job_dir / CONTROL_DIR / Control.STOP.value).exists() or not signals.stop_requested
                events.emit(Event.STOPPED if user else Event.PREEMPTED, step=already + done_now)
                LOG.info("stopped after %d of %d images; a second start continues from here", already + done_now,
                         total)
                return exitcodes.STOPPED_SAVED
            batch = pending[first:first + options.batch_size]
            items, images = _load_images(batch, options.image_side)
            texts = captioner(images) if images else []
            changes, expected, records = {}, {}, []
            for item, raw in zip(items, texts):
                new = finish(raw, target, options.avoid, options.max_words)
                text = merged(item.existing, new, options.existing, target, options.trigger)
                records.append({"image": item.rel, "caption": text})
                if text is not None and text != item.existing:
                    changes[item.caption_file] = text
                    expected[item.caption_file] = item.existing
            written = _write(self.dataset, changes, expected, label)
            kept = []   # a file that changed meanwhile is not in the ledger: a later start retries it
            for item, record in zip(items, records):
                if item.caption_file in changes and item.caption_file not in written:
                    continue
                kept.append({**record, "entry": written.get(item.caption_file, "")})
            append_ledger(self.job_dir, kept)
            written_files += sum(1 for r in kept if r["entry"])
            done_now += len(batch)
            unreadable += len(batch) - len(items)
            rate = done_now / max(time.monotonic() - started, 1e-6)
            events.emit(Event.STEP, step=already + done_now, total_steps=total, it_per_s=round(rate, 3),
                        eta_s=round((len(pending) - done_now) / rate, 1))
            for r in kept:
                LOG.info("%s: %s", r["image"], r["caption"] if r["caption"] is not None else "(kept as it was)")
            LOG.info("%d/%d images, %.2f images/s, about %.0f s left", already + done_now, total, rate,
                     (len(pending) - done_now) / rate)
        elapsed = time.monotonic() - started
        events.emit(Event.DONE, step=total, outputs=[], elapsed_s=round(elapsed, 2))
        LOG.info("went through %d images in %.1f s: %d caption files written, %d images unreadable (skipped)",
                 done_now, elapsed, written_files, unreadable)
        return exitcodes.OK

    def _preview(self, captioner: Captioner, pending: list[WorkItem], target: str) -> int:
        options = self.options
        items, images = _load_images(pending, options.image_side)
        shown = []
        for item, raw in zip(items, captioner(images) if images else []):
            new = finish(raw, target, options.avoid, options.max_words)
            text = merged(item.existing, new, options.existing, target, options.trigger)
            shown.append({"image": item.rel, "existing": item.existing, "caption": text, "generated": raw})
            print(json.dumps(shown[-1], ensure_ascii=False), flush=True)
        (self.job_dir / PREVIEW_FILE).write_text(json.dumps(shown, indent=1, ensure_ascii=False), encoding="utf-8")
        return exitcodes.OK


def run_caption_job(options: CaptionOptions, own_process: bool = False) -> int:
    """Run the job in this process; `own_process`: this process exists for the job (the CLI)."""
    return CaptionJob(options, own_process).run()
