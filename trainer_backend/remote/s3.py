"""S3-compatible storage (AWS S3, Cloudflare R2, MinIO, moto…) through boto3.

Layout: s3://<bucket>/<prefix>/<output.name>/ mirrors the run directory:
`checkpoints/step-XXXXXXXX/<files>` (manifest.json uploaded last, so a checkpoint without it
is incomplete and never chosen), the outputs, exported LoRA files and `samples/`.
The background uploader lives in uploader.py; this module is the storage itself.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..run.checkpoint_files import MANIFEST, PREFIX, checkpoint_name, sha256_file
from ..config import ConfigError, TrainConfig
from .secrets import Secrets

LOG = logging.getLogger("trainer")
MB = 1024 * 1024
for _noisy in ("botocore", "boto3", "s3transfer", "urllib3"):
    logging.getLogger(_noisy).setLevel(logging.WARNING)


@dataclass
class RemoteCheckpoint:
    step: int
    key: str            # key prefix of the folder, ending in "/"
    manifest: dict

    @property
    def metrics(self) -> dict:
        return self.manifest.get("metrics") or {}


def run_prefix(cfg: TrainConfig) -> str:
    """Key prefix of this run: <prefix>/<output.name>/ (no leading slash)."""
    parts = [p for p in cfg.cloud.prefix.strip("/").split("/") if p] + [cfg.output.name]
    return "/".join(parts) + "/"


def parse_s3_url(url: str) -> tuple[str, str]:
    """s3://bucket/key/prefix -> (bucket, key/prefix)."""
    if not url.startswith("s3://") or len(url) <= 5:
        raise ValueError(f"not an s3:// URL: {url}")
    bucket, _, key = url[5:].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {url}")
    return bucket, key


def make_client(cfg: TrainConfig, secrets: Secrets):
    """A boto3 S3 client. Keys named by cloud.access_key_name / secret_key_name when they are
    set (environment, then secrets file); otherwise boto3's own chain (~/.aws, instance role)."""
    import boto3
    from botocore.config import Config

    c = cfg.cloud
    style = c.addressing_style if c.addressing_style != "auto" else ("path" if c.endpoint_url else "virtual")
    config = Config(connect_timeout=min(10, c.timeout_s), read_timeout=c.timeout_s,
                    retries={"total_max_attempts": 2, "mode": "standard"}, s3={"addressing_style": style})
    access, secret = secrets.get(c.access_key_name), secrets.get(c.secret_key_name)
    if bool(access) != bool(secret):
        missing = "cloud.secret_key_name" if access else "cloud.access_key_name"
        name = c.secret_key_name if access else c.access_key_name
        raise ConfigError(f"{missing}: secret {name!r} is missing (the other key of the pair is set)")
    kwargs = {"aws_access_key_id": access, "aws_secret_access_key": secret} if access else {}
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=c.endpoint_url or None, region_name=c.region or None,
                          config=config, **kwargs)


class RemoteStore:
    """One run's folder in a bucket."""

    def __init__(self, client, bucket: str, root: str, multipart_mb: int = 64):
        from boto3.s3.transfer import TransferConfig
        self.client, self.bucket, self.root = client, bucket, root
        self.transfer = TransferConfig(multipart_threshold=multipart_mb * MB, multipart_chunksize=multipart_mb * MB,
                                       max_concurrency=4)

    @classmethod
    def from_config(cls, cfg: TrainConfig, secrets: Secrets) -> "RemoteStore | None":
        if not cfg.cloud.bucket:
            return None
        return cls(make_client(cfg, secrets), cfg.cloud.bucket, run_prefix(cfg), cfg.cloud.multipart_mb)

    def key(self, rel: str) -> str:
        return self.root + rel.lstrip("/")

    def url(self, rel: str = "") -> str:
        return f"s3://{self.bucket}/{self.key(rel)}"

    # ------------------------------------------------------------------ objects
    def put_file(self, local: Path, rel: str) -> int:
        """Upload one file (multipart above cloud.multipart_mb); returns its size."""
        self.client.upload_file(str(local), self.bucket, self.key(rel), Config=self.transfer)
        return Path(local).stat().st_size

    def list_sizes(self, rel_prefix: str = "") -> dict[str, int]:
        """key -> size of every object under root + rel_prefix."""
        out: dict[str, int] = {}
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.key(rel_prefix)):
            for obj in page.get("Contents", []):
                out[obj["Key"]] = obj["Size"]
        return out

    def get_json(self, key: str) -> dict | None:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            data = json.loads(body)
            return data if isinstance(data, dict) else None
        except ValueError:
            return None

    def delete_keys(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):
            chunk = [{"Key": k} for k in keys[i:i + 1000]]
            if chunk:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk, "Quiet": True})

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_folders(self) -> tuple[dict[int, dict[str, int]], dict[str, int]]:
        """step -> {key: size} of each step-XXXXXXXX folder under checkpoints/, and all sizes."""
        sizes = self.list_sizes("checkpoints/")
        base = self.key("checkpoints/")
        folders: dict[int, dict[str, int]] = {}
        for key, size in sizes.items():
            name = key[len(base):].split("/", 1)[0]
            if name.startswith(PREFIX) and name[len(PREFIX):].isdigit():
                folders.setdefault(int(name[len(PREFIX):]), {})[key] = size
        return folders, sizes

    def checkpoints(self) -> list[RemoteCheckpoint]:
        """Complete remote checkpoints, oldest first: manifest present, every file with its size."""
        folders, _ = self._checkpoint_folders()
        found = []
        for step, objects in sorted(folders.items()):
            prefix = self.key(f"checkpoints/{checkpoint_name(step)}/")
            if prefix + MANIFEST not in objects:
                continue
            manifest = self.get_json(prefix + MANIFEST)
            if manifest and _complete(manifest, prefix, objects, step):
                found.append(RemoteCheckpoint(step, prefix, manifest))
        return found

    def incomplete_steps(self) -> list[int]:
        """Steps of remote folders without a manifest (an upload cut short)."""
        folders, _ = self._checkpoint_folders()
        return [step for step, objects in sorted(folders.items())
                if self.key(f"checkpoints/{checkpoint_name(step)}/{MANIFEST}") not in objects]

    def put_folder(self, folder: Path, rel_base: str, done: set[str] | None = None, last: str = "") -> int:
        """Every file under folder (the one named `last` after all others). `done` (relative
        names already uploaded) lets a retry skip what went up before; returns the bytes sent."""
        folder = Path(folder)
        done = set() if done is None else done
        files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != last)
        sent = 0
        for path in [*files, *([folder / last] if last else [])]:
            rel = path.relative_to(folder).as_posix()
            if rel in done:
                continue
            sent += self.put_file(path, rel_base.rstrip("/") + "/" + rel)
            done.add(rel)
        return sent

    def upload_checkpoint(self, folder: Path, done: set[str] | None = None) -> int:
        """Every file of a checkpoint folder, then manifest.json last."""
        return self.put_folder(folder, f"checkpoints/{Path(folder).name}/", done, last=MANIFEST)

    def delete_checkpoint(self, step: int) -> None:
        """Manifest first: a half-deleted checkpoint is incomplete, never 'latest'."""
        prefix = f"checkpoints/{checkpoint_name(step)}/"
        keys = sorted(self.list_sizes(prefix))
        manifest = self.key(prefix + MANIFEST)
        if manifest in keys:
            self.delete_keys([manifest])
        self.delete_keys([k for k in keys if k != manifest])

    def download_checkpoint(self, folder_key: str, dest_root: Path, name: str) -> Path:
        """Download a remote checkpoint folder (key prefix ending in '/') to dest_root/name,
        verifying every file's sha256 against the manifest before the folder gets its name."""
        manifest = self.get_json(folder_key + MANIFEST)
        if not manifest:
            raise FileNotFoundError(f"s3://{self.bucket}/{folder_key}{MANIFEST} is missing or unreadable")
        dest_root = Path(dest_root)
        tmp, final = dest_root / f".download-{name}", dest_root / name
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for rel, meta in manifest["files"].items():
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            self.client.download_file(self.bucket, folder_key + rel, str(target), Config=self.transfer)
            if sha256_file(target) != meta["sha256"]:
                raise IOError(f"s3://{self.bucket}/{folder_key}{rel} does not match its manifest (sha256)")
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final


def _complete(manifest: dict, prefix: str, objects: dict[str, int], step: int) -> bool:
    try:
        if manifest.get("step") != step:
            return False
        return all(objects.get(prefix + rel) == meta["size"] for rel, meta in manifest["files"].items())
    except (AttributeError, KeyError, TypeError):
        return False


def store_for_url(cfg: TrainConfig, secrets: Secrets, url: str) -> tuple[RemoteStore, str]:
    """A store for an explicit s3:// checkpoint URL (any bucket) and the folder's key prefix."""
    bucket, key = parse_s3_url(url)
    store = RemoteStore(make_client(cfg, secrets), bucket, "", cfg.cloud.multipart_mb)
    return store, key.rstrip("/") + "/"
