"""The studio's server-side objects, shared by every page and browser session."""
from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from trainer_backend.config import ConfigError, TrainConfig, dumps_toml, from_dict, to_dict
from trainer_backend.run.contract import CONFIG_FILE

from gui.presets import PresetError, PresetStore, overlay
from gui.run_control import RunManager
from gui.schema_form import FormField, config_to_values, form_fields

DEMO_PRESET = "demo-sd1-lora"


@dataclass
class Settings:
    runs_dir: Path = Path("runs")
    presets_dir: Path | None = None
    python: str = sys.executable
    initial_preset: str = DEMO_PRESET
    stop_timeout_s: float = 120.0
    refresh_s: float = 1.5
    idle_refresh_s: float = 10.0    # the Run page while no run is live: each tick costs the browser ~1 CPU-s
    allowed_output_dirs: list[Path] = field(default_factory=list)   # besides runs_dir (--allow-output-dir)
    datasets_dir: Path = Path("datasets")                            # the Datasets page's folder (--datasets-dir)
    dataset_roots: list[Path] = field(default_factory=list)          # other folders it may open (--allow-dataset-dir)


@dataclass
class Studio:
    settings: Settings
    store: PresetStore
    manager: RunManager
    fields: list[FormField] = field(default_factory=form_fields)

    queue: object = None   # the JobQueue (trainer_backend/jobqueue) when the studio runs one

    @classmethod
    def create(cls, settings: Settings, gpu_count: int = 0, queue=None) -> "Studio":
        store = PresetStore(settings.presets_dir) if settings.presets_dir else PresetStore()
        manager = RunManager(settings.runs_dir, gpu_count=gpu_count, python=settings.python,
                             stop_timeout_s=settings.stop_timeout_s,
                             allowed_roots=settings.allowed_output_dirs)
        manager.queue = queue   # Start and Resume add jobs to it
        return cls(settings=settings, store=store, manager=manager, queue=queue)

    # ------------------------------------------------------------------ configs
    def base(self) -> dict:
        """Sparse values under every preset: runs go to --runs-dir."""
        return {"output": {"dir": str(self.settings.runs_dir)}}

    def defaults(self) -> TrainConfig:
        return from_dict(self.base())

    def load_preset(self, label: str) -> TrainConfig:
        return self.store.load(label, base=self.base())

    def card_gb(self) -> float:
        """The memory of the smallest detected GPU (GB), 0 without one: what tiered presets are picked for."""
        from trainer_backend.launch.memory_advice import detect_card_gb
        return detect_card_gb()

    def preset_for_card(self, preset):
        """The sibling of a tiered built-in preset (<base>-<N>gb) planned for the detected card, else `preset`."""
        from gui.presets import tier_for_card
        if not preset.builtin:
            return preset
        builtins = [p for p in self.store.list() if p.builtin]
        name = tier_for_card([p.name for p in builtins], preset.name, self.card_gb())
        return next(p for p in builtins if p.name == name)

    def initial(self) -> tuple[str | None, TrainConfig]:
        """The preset the page opens with (the demo), or the defaults when it is missing."""
        for preset in self.store.list():
            if preset.name == self.settings.initial_preset:
                try:
                    return preset.label, self.load_preset(preset.label)
                except PresetError:
                    break
        return None, self.defaults()

    def initial_values(self) -> tuple[str | None, list]:
        label, cfg = self.initial()
        return label, config_to_values(self.fields, cfg)

    # ------------------------------------------------------------------ command preview
    def command_preview(self, cfg: TrainConfig) -> tuple[str, str, str]:
        """(shell line with the environment it adds, the argv as a JSON list, the resolved TOML
        without secrets)."""
        from trainer_backend.launch.argv import build_launch_argv, build_launch_env, hardware_notes
        cfg = cfg.model_copy(deep=True)
        cfg.output.dir = str((self.manager.cwd / cfg.output.dir).resolve())
        config_path = cfg.run_dir / CONFIG_FILE
        argv = build_launch_argv(cfg, config_path, python=self.settings.python)
        env = build_launch_env(cfg)
        secrets = {str(v) for v in _secret_values(self.fields, cfg) if v}
        shown_env = {k: ("••••" if v in secrets else v) for k, v in env.items()}
        env_line = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown_env.items())
        shell = (env_line + " " if env_line else "") + shlex.join(argv)
        notes = "".join(f"\n# note: {n}" for n in hardware_notes(cfg))
        if cfg.hardware.num_machines > 1:
            from trainer_backend.launch.argv import node_commands
            nodes = node_commands(cfg, config_path, python=self.settings.python)
            notes += "".join(f"\n\n# machine_rank {rank}: run this on that machine\n{shlex.join(node)}"
                             for rank, node in enumerate(nodes))
        return shell + notes, json.dumps(argv, indent=1), dumps_toml(to_dict(cfg))


def _secret_values(fields: list[FormField], cfg: TrainConfig) -> list:
    data = to_dict(cfg)
    return [data[f.section][f.key] for f in fields if f.secret]


def preset_error_text(error: Exception) -> str:
    return f"⚠️ {error}" if isinstance(error, (PresetError, ConfigError)) else f"⚠️ {type(error).__name__}: {error}"


__all__ = ["Settings", "Studio", "overlay", "preset_error_text"]
