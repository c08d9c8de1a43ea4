"""kohya_ss files as the importer receives them: the text checked before parsing (size, nesting),
values shown shortened in the report, and lr_warmup given in % converted with the step plan's
count. Pure but for planned_steps (a dataset scan, as the live plan runs it)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainer_backend.config import TrainConfig
from trainer_backend.file_limits import read_text_capped


class ImportProblem(ValueError):
    pass


FILE_LIMIT = 1024 * 1024   # bytes: a kohya_ss config is a few KB; checked before parsing
DEPTH_LIMIT = 8            # kohya's settings are flat; a deeper file is not one (checked before parsing)
VALUE_LIMIT = 4096         # characters of one text value (a path, a prompt list)
BAD_VALUE = (TypeError, ValueError, OverflowError)


def parse_kohya_text(text: str) -> Any:
    """JSON text, its size and nesting checked before the parser sees it (a 40 MB value or 100,000
    nested brackets is one line, not a minute of parsing or a RecursionError)."""
    if len(text) > FILE_LIMIT:
        raise ImportProblem(f"not a kohya_ss config: {len(text):,} characters (a config is a few KB; at most "
                            f"{FILE_LIMIT:,})")
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (ch == "\\", ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > DEPTH_LIMIT:
                raise ImportProblem(f"not a kohya_ss config: nested more than {DEPTH_LIMIT} levels deep (kohya's "
                                    "settings are flat)")
        elif ch in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ImportProblem(f"not a kohya_ss JSON file: {e.msg} at line {e.lineno}") from None
    except (RecursionError, ValueError) as e:
        raise ImportProblem(f"not a kohya_ss JSON file ({type(e).__name__})") from None


def convert_warmup(result: KohyaImport, total_steps: int | None, why: str = "") -> None:
    """lr_warmup given as a percentage with no max_train_steps: a share of the step plan's total
    (one process), or a report line saying why it could not be counted."""
    if result.warmup_percent is None:
        return
    if total_steps:
        steps = int(round(result.warmup_percent / 100 * total_steps))
        result.data.setdefault("optimizer", {})["warmup_steps"] = steps
        result.mapped.append(("lr_warmup", "optimizer.warmup_steps", steps))
        result.notes.append(f"lr_warmup {result.warmup_percent:g}% of the step plan's {total_steps:,} steps "
                            f"converted to optimizer.warmup_steps = {steps}")
    else:
        result.unsupported.append(("lr_warmup", f"{result.warmup_percent:g}% not converted: the step count needs "
                                                f"{why or 'the dataset'}; set optimizer.warmup_steps by hand"))
    result.warmup_percent = None


def planned_steps(cfg: TrainConfig) -> tuple[int | None, str]:
    """The step plan's total for one process (what optimizer.warmup_steps counts in), from a scan of
    the config's dataset; (None, what is missing) when it cannot be counted."""
    from trainer_backend.launch.plan import plan_from_config

    from gui.dataset_view import inspect_dataset
    try:
        counts = inspect_dataset(cfg).counts
        return plan_from_config(cfg, counts, 1).single.total_steps, ""
    except Exception as e:  # noqa: BLE001 - any refusal of the scan: the report says what it was
        return None, f"a dataset that can be scanned ({str(e).splitlines()[0][:200] if str(e) else type(e).__name__})"


def read_kohya_file(path: str | Path) -> str:
    """The file's text: a regular file of at most FILE_LIMIT bytes (file_limits.py)."""
    return read_text_capped("kohya_ss file", path, FILE_LIMIT)


def shown(value: Any, limit: int = 80) -> str:
    """A value as the report shows it: its repr, shortened (a file's 40 MB value is never echoed back)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 20]}…{text[-8:]} ({len(text):,} characters)"
