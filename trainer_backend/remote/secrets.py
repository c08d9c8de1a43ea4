"""Credentials for S3 and webhooks: looked up by name in the environment, then in the
secrets file named by `cloud.secrets_file` (NAME=value lines, mode 0600).

The config only ever holds *names* of secrets, so config.toml, presets and argv cannot leak
them. Values found here are registered with a logging filter that masks them, as a second
line of defence for messages that quote an exception or a URL.
"""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from ..config import ConfigError, TrainConfig

MASK = "***"


def parse_secrets_file(text: str) -> dict[str, str]:
    """`NAME=value` lines (an `export ` prefix, quotes around the value, blank lines and
    `#` comments are allowed), the dotenv/TOML subset people write by hand."""
    values: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        if "=" not in line:
            raise ValueError(f"line {number}: expected NAME=value")
        name, value = (part.strip() for part in line.split("=", 1))
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if not name.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ValueError(f"line {number}: {name!r} is not a valid name")
        values[name] = value
    return values


def read_secrets_file(path: str | Path, key: str = "cloud.secrets_file") -> dict[str, str]:
    """The file's NAME=value pairs; refuses files other users can read (like ssh does)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"{key}: {p} does not exist")
    mode = stat.S_IMODE(p.stat().st_mode)
    if os.name == "posix" and mode & 0o077:
        raise ConfigError(f"{key}: {p} is readable by other users (mode {mode:o}); run `chmod 600 {p}`")
    try:
        return parse_secrets_file(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{key}: {p}: {e}") from None


class Secrets:
    """Secret values by name: the environment first, then the secrets file."""

    def __init__(self, file_values: dict[str, str] | None = None, environ: dict[str, str] | None = None):
        self._file = dict(file_values or {})
        self._env = os.environ if environ is None else environ

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> "Secrets":
        path = cfg.cloud.secrets_file
        return cls(read_secrets_file(path) if path else {})

    def file_values(self) -> dict[str, str]:
        return dict(self._file)

    def get(self, name: str) -> str | None:
        if not name:
            return None
        value = self._env.get(name)
        if value is None:
            value = self._file.get(name)
        return value or None

    def require(self, name: str, key: str) -> str:
        """The value of secret `name`, or a ConfigError naming the config key that asked for it."""
        value = self.get(name)
        if value is None:
            raise ConfigError(f"{key}: secret {name!r} is set neither in the environment nor in cloud.secrets_file")
        return value


class MaskSecrets(logging.Filter):
    """Replaces known secret values in log records (message and arguments) with ***."""

    def __init__(self, values: set[str]):
        super().__init__()
        self.values = {v for v in values if v and len(v) >= 4}

    def mask(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, MASK)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if self.values:
            message = record.getMessage()
            masked = self.mask(message)
            if masked != message:
                record.msg, record.args = masked, None
            if record.exc_info and record.exc_info[1] is not None:
                text = self.mask(logging.Formatter().formatException(record.exc_info))
                record.exc_info, record.exc_text = None, text
            elif record.exc_text:  # another handler's filter (or formatter) already turned it into text
                record.exc_text = self.mask(record.exc_text)
        return True


def mask_in_logs(values: set[str]) -> MaskSecrets:
    """Install (or extend) the masking filter on every handler of the root logger."""
    for handler in logging.getLogger().handlers:
        existing = next((f for f in handler.filters if isinstance(f, MaskSecrets)), None)
        if existing is None:
            existing = MaskSecrets(set())
            handler.addFilter(existing)
        existing.values |= {v for v in values if v and len(v) >= 4}
    return MaskSecrets(values)
