"""`python -m trainer_backend.client submit|status|stop|logs|download` (docs/queue.md)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .api_client import ApiClient, ApiError

FINISHED = {"done": 0, "stopped": 75, "error": 1, "interrupted": 1}


def _line(job: dict) -> str:
    step = f"step {job.get('step') or 0}/{job.get('total') or '?'}"
    loss = f", loss {job['loss']:.4f}" if isinstance(job.get("loss"), (int, float)) else ""
    eta = f", ETA {int(job['eta_s'])} s" if isinstance(job.get("eta_s"), (int, float)) else ""
    gpus = f" on {','.join(job['gpus'])}" if job.get("gpus") else ""
    msg = f": {job['message']}" if job.get("message") else ""
    return f"job {job['id']} {job['name']}: {job['status']}{gpus}, {step}{loss}{eta}{msg}"


def wait(client: ApiClient, job_id: int, poll_s: float = 2.0, patience_s: float = 600.0) -> int:
    """Print each change of the job's progress; the job's exit code once it has finished. A studio
    that restarts meanwhile is waited for (the job goes on without it)."""
    last, away_since = "", None
    while True:
        try:
            job = client.job(job_id)
            away_since = None
        except ApiError as e:
            if e.status != 0:
                raise
            if away_since is None:
                away_since = time.monotonic()
                print(f"{e}; waiting for the studio to come back", flush=True)
            elif time.monotonic() - away_since > patience_s:
                raise
            time.sleep(poll_s)
            continue
        line = _line(job)
        if line != last:
            print(line, flush=True)
            last = line
        if job["status"] in FINISHED:
            return FINISHED[job["status"]] if job["status"] != "error" else (job.get("exit_code") or 1)
        time.sleep(poll_s)


def follow_log(client: ApiClient, job_id: int, follow: bool, poll_s: float = 1.0) -> int:
    after = 0
    while True:
        out = client.log(job_id, after)
        for line in out["lines"]:
            print(line, flush=True)
        after = out["next"]
        if not follow or out["status"] in FINISHED:
            return 0
        time.sleep(poll_s)


def download(client: ApiClient, job_id: int, to: Path) -> int:
    for f in client.files(job_id):
        target = (to / f["name"]).resolve()
        if not target.is_relative_to(to.resolve()):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(client.file(job_id, f["name"]))
        print(f"{target} ({f['size']} bytes)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer_backend.client", description="the studio's API from a shell")
    p.add_argument("--url", default=None, help="the studio (default $SD_STUDIO_URL or http://127.0.0.1:7860)")
    p.add_argument("--token", default=None, help="an API token (default $SD_STUDIO_TOKEN)")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("submit", help="submit a config (TOML) as a training job")
    s.add_argument("config", type=Path)
    s.add_argument("--priority", type=int, default=0)
    s.add_argument("--front", action="store_true", help="before every waiting job")
    s.add_argument("--wait", action="store_true", help="print progress; exit with the job's code")
    st = sub.add_parser("status", help="one job, or every job")
    st.add_argument("job", type=int, nargs="?")
    sp = sub.add_parser("stop", help="save state, then stop")
    sp.add_argument("job", type=int)
    lg = sub.add_parser("logs", help="the job's console output")
    lg.add_argument("job", type=int)
    lg.add_argument("-f", "--follow", action="store_true")
    dl = sub.add_parser("download", help="the job's output files")
    dl.add_argument("job", type=int)
    dl.add_argument("--to", type=Path, default=Path("."))
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    client = ApiClient(args.url, args.token)
    try:
        if args.cmd == "submit":
            try:
                text = args.config.read_text(encoding="utf-8")
            except OSError as e:
                print(f"error: {args.config}: {e.strerror}", file=sys.stderr)
                return 2
            job = client.submit(text, args.priority, args.front)
            print(f"job {job['id']} submitted: {job['run_dir']}", flush=True)
            return wait(client, job["id"]) if args.wait else 0
        if args.cmd == "status":
            jobs = [client.job(args.job)] if args.job else client.jobs()["jobs"]
            for job in jobs:
                print(_line(job))
            return 0
        if args.cmd == "stop":
            print(_line(client.stop(args.job)))
            return 0
        if args.cmd == "logs":
            return follow_log(client, args.job, args.follow)
        return download(client, args.job, args.to)
    except ApiError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if e.status == 422 else 1


if __name__ == "__main__":
    sys.exit(main())
