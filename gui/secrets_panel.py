"""Secrets typed into the page (S3 keys, webhook tokens, the W&B key).

The config only holds the *names* of secrets (cloud.access_key_name = "AWS_ACCESS_KEY_ID", …);
the trainer reads the values from its environment or cloud.secrets_file. Values typed here
stay in the browser page and go into the started process's environment only: never into
presets, config.toml, command.txt, process.json or logs (the trainer masks known values)."""
from __future__ import annotations

import os
import re
from typing import Any

import gradio as gr
from pydantic import BaseModel

from trainer_backend.config import TrainConfig, sections

ROWS = 4
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
NAME_FIELD_HINT = "name of the secret"   # how the schema's help text introduces a secret-name field


def _name_fields(model: BaseModel, prefix: str):
    """(dotted key, value) of every field holding a secret's name, nested tables included."""
    for key, info in type(model).model_fields.items():
        value = getattr(model, key)
        dotted = f"{prefix}.{key}"
        if isinstance(value, str) and NAME_FIELD_HINT in (info.description or "").lower():
            yield dotted, value
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _name_fields(item, f"{dotted}.{i}")


def secret_names(cfg: TrainConfig) -> list[tuple[str, str]]:
    """(config key, secret name) pairs the config refers to, in schema order, non-empty."""
    out = []
    for section in sections():
        for dotted, name in _name_fields(getattr(cfg, section), section):
            if name:
                out.append((dotted, name))
    return out


def env_from_rows(values: list[Any]) -> dict[str, str]:
    """(name, value, name, value, …) widget values -> environment additions; bad names ignored."""
    env = {}
    for name, value in zip(values[0::2], values[1::2]):
        name, value = (name or "").strip(), value or ""
        if name and value and ENV_NAME.match(name):
            env[name] = value
    return env


def status_markdown(cfg: TrainConfig, typed: dict[str, str]) -> str:
    pairs = secret_names(cfg)
    if not pairs:
        return "This config refers to no secrets."
    file_hint = f" or `{cfg.cloud.secrets_file}`" if getattr(cfg.cloud, "secrets_file", "") else ""
    lines = ["| secret | used by | value from |", "|---|---|---|"]
    for dotted, name in pairs:
        where = ("typed here" if name in typed else "the studio's environment" if name in os.environ
                 else f"not set here (the trainer looks in its environment{file_hint}; needed only when "
                      "that feature is on)")
        lines.append(f"| `{name}` | `{dotted}` | {where} |")
    return "\n".join(lines)


def build_secrets_panel() -> tuple[list, gr.Markdown]:
    """Rows of (name, password) boxes; returns the flat list of boxes and the status line."""
    boxes = []
    with gr.Accordion("Secrets for runs started from this page", open=False, elem_id="secrets-panel"):
        gr.Markdown("Values typed here go into the training process's environment only: never into presets, "
                    "config.toml, the command or the logs. They are forgotten when you close the page.")
        for i in range(ROWS):
            with gr.Row():
                boxes.append(gr.Textbox(label="name", placeholder="e.g. AWS_SECRET_ACCESS_KEY", scale=1,
                                        elem_id=f"secret-name-{i}"))
                boxes.append(gr.Textbox(label="value", type="password", scale=2, elem_id=f"secret-value-{i}"))
        status = gr.Markdown("", elem_id="secrets-status")
    return boxes, status
