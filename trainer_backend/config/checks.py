"""Checks that need the file system, run before a run starts (the schema checks types and bounds;
config/rules.py the combinations of options). `run_problems` returns every problem at once, file
problems first; `validate_for_run` raises the first."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from . import TrainConfig, rules
from .base import ConfigError, Problem
from .input_checks import dataset_images, model_files
from ..file_limits import file_kind_problem, read_text_capped
from .paths import BUILTIN_PREFIX, PROJECT_ROOT, resolve_path, resolve_paths  # noqa: F401 (re-exported)


def _dataset_path(cfg: TrainConfig) -> Iterator[Problem]:
    if not cfg.dataset.path and not getattr(cfg.dataset, "subsets", None):
        yield Problem("dataset.path", "required (a folder of images with captions)")
    elif cfg.dataset.path and not Path(cfg.dataset.path).is_dir():
        yield Problem("dataset.path", f"{cfg.dataset.path} is not a folder")


def _model_paths(cfg: TrainConfig) -> Iterator[Problem]:
    from ..model_sources import hub_problems, hub_spec  # hub repo ids download when the run starts
    if not cfg.model.path:
        yield Problem("model.path", "required (a diffusers folder, a .safetensors file, a hub repo org/name, or "
                                    "builtin:tiny-sd1)")
    elif (not cfg.model.path.startswith(BUILTIN_PREFIX) and not Path(cfg.model.path).exists()
          and hub_spec(cfg.model.path) is None):
        yield Problem("model.path", f"{cfg.model.path} does not exist")
    elif problem := file_kind_problem(cfg.model.path, folder_ok=True):  # a FIFO would hang the loader
        yield Problem("model.path", f"{cfg.model.path} {problem}")
    if cfg.model.vae and not Path(cfg.model.vae).exists() and hub_spec(cfg.model.vae) is None:
        yield Problem("model.vae", f"{cfg.model.vae} does not exist")
    elif cfg.model.vae and (problem := file_kind_problem(cfg.model.vae, folder_ok=True)):
        yield Problem("model.vae", f"{cfg.model.vae} {problem}")
    yield from (Problem(key, message) for key, message in hub_problems(cfg))


def _run_folder(cfg: TrainConfig) -> Iterator[Problem]:
    from ..run.run_folder import run_folder_problem  # new, or already a run's: never the user's other files
    problem = run_folder_problem(cfg.run_dir)
    if problem:
        key, _, message = problem.partition(":")
        yield Problem(key.strip(), message.strip())


def _resolved(value) -> Path | None:
    try:
        return Path(value).expanduser().resolve()
    except (OSError, ValueError):
        return None


def _no_overlap(cfg: TrainConfig) -> Iterator[Problem]:
    """The run folder must not be inside a dataset folder, nor a dataset inside the run folder: the
    run's own samples would become training images, and the next start would see a changed dataset."""
    run = _resolved(cfg.run_dir)
    if run is None:  # an unusable path (a NUL byte): _run_folder already names it
        return
    folders = [("dataset.path", cfg.dataset.path), ("dataset.class_path", cfg.dataset.class_path),
               *((f"dataset.subsets[{i}].path", s.path) for i, s in enumerate(cfg.dataset.subsets))]
    for key, value in folders:
        if not value or str(value).startswith(BUILTIN_PREFIX):
            continue
        data = _resolved(value)
        if data is None:
            continue
        if run == data or run.is_relative_to(data):
            yield Problem("output.dir", f"the run folder {run} is inside {key} ({data}); its samples and "
                                        f"checkpoints would become training data. Put output.dir elsewhere")
        elif data.is_relative_to(run):
            yield Problem(key, f"{data} is inside the run folder {run} (output.dir/output.name); keep the dataset "
                               f"outside it")


def _control_folders(cfg: TrainConfig) -> Iterator[Problem]:
    """Each control folder exists, and is neither its image folder nor inside it (its control images
    would be scanned as training images)."""
    from .control_rules import control_sources
    images = {"dataset.control_path": cfg.dataset.path,
              **{f"dataset.subsets[{i}].control_path": s.path for i, s in enumerate(cfg.dataset.subsets)}}
    for key, value in control_sources(cfg):
        if not value:
            continue
        folder, root = _resolved(resolve_path(value)), _resolved(images[key]) if images[key] else None
        if folder is None or not folder.is_dir():
            yield Problem(key, f"{value} is not a folder (the control images, one per training image)")
        elif root is not None and folder.is_relative_to(root):
            yield Problem(key, f"{folder} is inside the image folder {root}: its control images would be trained "
                               f"as images; keep the control images in a folder of their own")


def _sample_controls(cfg: TrainConfig) -> Iterator[Problem]:
    """Every `--control` image of a sample prompt exists (inline lines and the prompt file); the prompt
    file's lines fit the family's control images (the inline ones: config/control_rules.py)."""
    from .control_rules import family_control_mode
    from .sample_prompts import control_line_problems, defaults_of, parse_prompt_line, prompt_lines
    if cfg.network.type == "vae":
        return
    try:
        lines = prompt_lines(cfg)
    except ConfigError:  # an unreadable prompt file: _prompt_file names it
        return
    for key, number, line in lines:
        try:
            controls = parse_prompt_line(line, defaults_of(cfg)).controls
        except ValueError:
            continue
        for control in controls:
            if not Path(resolve_path(control)).expanduser().is_file():  # it decodes: checked when sampling starts
                yield Problem(key, f"line {number}: --control {control}: no such image file")
    if cfg.samples.prompt_file:
        text = read_text_capped("samples.prompt_file", cfg.samples.prompt_file)  # read above: cannot fail here
        yield from (Problem(key, message) for key, message in control_line_problems(
            cfg, "samples.prompt_file", text, family_control_mode(cfg.model.arch), cfg.model.arch))


def _validation_folder(cfg: TrainConfig) -> Iterator[Problem]:
    if cfg.validation.path and not Path(resolve_path(cfg.validation.path)).is_dir():
        yield Problem("validation.path", f"{resolve_path(cfg.validation.path)} is not a folder")


def _prompt_file(cfg: TrainConfig) -> Iterator[Problem]:
    from .sample_prompts import line_problems, load_prompts
    s = cfg.samples
    if not s.prompt_file:
        return
    try:
        text = read_text_capped("samples.prompt_file", s.prompt_file)  # regular files only, size capped
    except ConfigError as e:
        key, _, message = str(e).partition(": ")
        yield Problem(key, message)
        return
    bad = [Problem(key, message) for key, message in line_problems(cfg, "samples.prompt_file", text)]
    yield from bad
    if not bad and (s.every_n_steps or s.every_n_epochs or s.before_first_step) and not any(
            p.key == "samples.prompts" for p in rules.problems(cfg, "samples")) and not load_prompts(cfg):
        yield Problem("samples.prompts", "no prompts, but sampling is scheduled (samples.every_n_steps, "
                                         "every_n_epochs or before_first_step); add prompts or samples.prompt_file")


def _training_adapter(cfg: TrainConfig) -> Iterator[Problem]:
    """network.training_adapter: a .safetensors file, seen before the model loads (its keys are checked then)."""
    from .input_checks import safetensors_header_problem
    n = cfg.network
    if not n.training_adapter or n.type != "lora":
        return
    path = Path(resolve_path(n.training_adapter)).expanduser()
    if not path.is_file():
        yield Problem("network.training_adapter", f"{path}: no such file")
    elif problem := safetensors_header_problem(path):
        yield Problem("network.training_adapter", f"{path}: {problem}")


FILE_CHECKS = (_model_paths, model_files, _dataset_path, dataset_images, _run_folder, _no_overlap, _control_folders, _validation_folder, _prompt_file,
               _sample_controls, _training_adapter)


def run_problems(cfg: TrainConfig) -> list[Problem]:
    """Every problem that would stop `train` before the model loads: the file checks above, the
    cross-field rules (config/rules.py) and the methods' own (methods/checks.py: DreamBooth class
    images). `cfg`'s relative paths are resolved in place."""
    from ..methods.checks import method_problems
    cfg = resolve_paths(cfg)
    found = [p for check in FILE_CHECKS for p in check(cfg)]
    return found + [p for p in [*rules.problems(cfg), *method_problems(cfg)] if p not in found]


def validate_dataset_only(cfg: TrainConfig) -> TrainConfig:
    """For `plan` and `inspect`: only what scanning the dataset needs."""
    cfg = resolve_paths(cfg)
    for problem in _dataset_path(cfg):
        raise problem.error()
    return cfg


def validate_for_run(cfg: TrainConfig) -> TrainConfig:
    """Raise ConfigError naming the key with the first of `run_problems`."""
    found = run_problems(cfg)
    if found:
        raise found[0].error()
    return cfg
