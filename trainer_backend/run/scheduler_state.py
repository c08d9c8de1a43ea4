"""The LR scheduler's state in a checkpoint as JSON (`lr_scheduler.json`): numbers and lists, never
a pickle (run/safe_load.py says why). Older checkpoints hold it as accelerate's pickled
`custom_checkpoint_0.pkl`; those still resume, read by the weights_only unpickler."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Iterator

from .safe_load import UnsafeCheckpointError, read_json

SCHEDULER_FILE = "lr_scheduler.json"
LEGACY_FILE = "custom_checkpoint_0.pkl"  # accelerate's register_for_checkpointing, before JSON


def register_scheduler_state(accelerator, scheduler) -> None:
    """Save the scheduler with every checkpoint (main process) and load it back on resume."""

    def save_hook(models, weights, output_dir):
        if accelerator.is_main_process:
            text = json.dumps(scheduler.state_dict(), indent=1)  # repr floats: exact round trip
            (Path(output_dir) / SCHEDULER_FILE).write_text(text, encoding="utf-8")

    def load_hook(models, input_dir):
        path = Path(input_dir) / SCHEDULER_FILE
        if path.is_file():
            state = read_json(path)
            if not isinstance(state, dict) or not isinstance(state.get("last_epoch"), int):
                raise UnsafeCheckpointError(f"{path}: not an LR scheduler state (no integer last_epoch)")
            scheduler.load_state_dict(state)

    accelerator.register_save_state_pre_hook(save_hook)
    accelerator.register_load_state_pre_hook(load_hook)


@contextlib.contextmanager
def legacy_scheduler_state(accelerator, scheduler, folder: Path) -> Iterator[None]:
    """A checkpoint from before lr_scheduler.json: let accelerate load custom_checkpoint_0.pkl into
    the scheduler (inside safe_load.tensors_only, so through the weights_only unpickler), then
    unregister it so new checkpoints are JSON only."""
    folder = Path(folder)
    if (folder / SCHEDULER_FILE).is_file() or not (folder / LEGACY_FILE).is_file():
        yield
        return
    accelerator.register_for_checkpointing(scheduler)
    try:
        yield
    finally:
        # accelerate has no public unregister; its list of custom objects is what it saves next time
        accelerator._custom_objects.remove(scheduler)
