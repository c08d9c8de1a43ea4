"""In-process training runs for the methods/EMA/samples/DreamBooth tests (tiny models, 32 px, CPU)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from trainer_backend.config import load_config
from trainer_backend.training.loop import train
from trainer_backend.config.checks import validate_for_run


def train_run(tmp_path: Path, model_dir: Path, data: Path, name: str, *overrides: str):
    """Train with the given overrides; returns (run dir, events, cfg)."""
    from accelerate.state import AcceleratorState
    # accelerate's state is a per-process singleton: let this run choose its own mixed precision
    AcceleratorState._reset_state(reset_partial_state=True)
    cfg = validate_for_run(load_config(None, [
        f"model.path={model_dir}", f"dataset.path={data}", "dataset.resolution=32",
        f"output.dir={tmp_path / 'runs'}", f"output.name={name}", "precision.mixed=no",
        "network.rank=4", "network.alpha=4", "hardware.cpu=true", "logging.tensorboard=false",
        "dataset.cache_auto=false", *overrides]))  # the tests name the caches they want (test_speed: the default)
    try:
        assert train(cfg) == 0
    finally:  # and leave none behind for the next in-process run
        AcceleratorState._reset_state(reset_partial_state=True)
    run = cfg.run_dir
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    return run, events, cfg


def last_checkpoint(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("step-*"))[-1]


def unet_probe(unet, seed: int = 1) -> torch.Tensor:
    """The UNet's prediction on a fixed random input (what a loaded model must reproduce)."""
    cfg = unet.config
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, cfg.in_channels, 8, 8, generator=g)
    ctx = torch.randn(2, 77, cfg.cross_attention_dim, generator=g)
    added = None
    if cfg.addition_embed_type == "text_time":
        pooled = cfg.projection_class_embeddings_input_dim - 6 * cfg.addition_time_embed_dim
        added = {"text_embeds": torch.randn(2, pooled, generator=g),
                 "time_ids": torch.tensor([[32.0, 32, 0, 0, 32, 32]] * 2)}
    with torch.no_grad():
        return unet(x, torch.tensor([10, 500]), ctx, added_cond_kwargs=added).sample
