"""A small client of the studio's API (/api/v1): `python -m trainer_backend.client submit my.toml --wait`.
Standard library only, so it runs on a machine that has none of the studio's packages."""
from .api_client import ApiClient, ApiError

__all__ = ["ApiClient", "ApiError"]
