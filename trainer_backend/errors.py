"""The error a user can fix: a leaf module, so every package can raise it without importing the
schema (config/ imports the family registry; families/ must not import config/)."""


class ConfigError(ValueError):
    """A config problem a user can fix; `str()` is one line naming the key or file."""
