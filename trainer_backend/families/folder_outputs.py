"""Outputs of a family whose LoRA files have a ComfyUI layout of their own (its lora_keys module) and whose
full fine-tune is written as a diffusers folder only (no single file is published for it): Wan 2.2 and LTX-2."""
from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError


class FolderOutputs:
    """Mixin, listed before the family's base class. The family gives `comfy_lora(adapter_states, alpha)`."""

    def comfy_lora(self, adapter_states: dict, alpha: float) -> dict:
        raise NotImplementedError

    def lora_file_state(self, model, adapter_states, alpha, layout="auto"):
        if self.lora_layout(layout) == "kohya":
            return self.comfy_lora(adapter_states, alpha)
        return super().lora_file_state(model, adapter_states, alpha, layout)

    def save_pipeline_folder(self, model, folder: Path) -> None:
        self.build_pipeline(model, "default").save_pretrained(str(folder), safe_serialization=True)

    def save_full_model(self, model, folder, single_file, dtype=None, metadata=None) -> list[Path]:
        if folder is None:
            raise ConfigError(f"output: a {self.label} full fine-tune is written as a diffusers folder")
        self.save_pipeline_folder(model, Path(folder))
        return [Path(folder)]
