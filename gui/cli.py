"""`python app.py`: parse flags, refuse unsafe exposure, build and serve the studio.

The exposure check runs before gradio is imported, so a refused start is immediate."""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from gui.security import OPT_OUT_FLAG, SecurityError, allowed_hosts, check_exposure, parse_auth


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python app.py", description="SD Training Studio (browser GUI)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--listen", action="store_true", help="bind 0.0.0.0 (all interfaces); needs --auth")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--auth", default="", metavar="USER:PASS|FILE",
                   help="user:password (comma-separated for several) or a file of user:password lines")
    p.add_argument("--share", action="store_true", help="public gradio.live link (needs --auth and internet)")
    p.add_argument(OPT_OUT_FLAG, dest="allow_unauthenticated", action="store_true",
                   help="serve on a non-loopback address or --share WITHOUT a password (anyone who can reach "
                        "it can start jobs and read files on this machine)")
    p.add_argument("--root-path", default="", help="URL prefix when served behind a reverse proxy, e.g. /studio")
    p.add_argument("--runs-dir", default="runs", help="folder of run directories (default ./runs)")
    p.add_argument("--allow-output-dir", action="append", default=[], metavar="DIR",
                   help="a folder (besides --runs-dir) that runs started from the studio may write into; repeatable")
    p.add_argument("--datasets-dir", default="datasets", help="folder of datasets for the Datasets page (default ./datasets)")
    p.add_argument("--allow-dataset-dir", action="append", default=[], metavar="DIR",
                   help="a folder (besides --datasets-dir) the Datasets page may open and import from; repeatable")
    p.add_argument("--presets-dir", default="", help="folder of user presets (default presets/user/)")
    p.add_argument("--preset", default="demo-sd1-lora", help="preset loaded when the page opens")
    p.add_argument("--stop-timeout", type=float, default=120.0,
                   help="seconds a graceful Stop may take before Force kill is offered")
    p.add_argument("--inbrowser", action="store_true", help="open a browser tab")
    p.add_argument("--headless", action="store_true", help="run the job queue and the API (/api/v1) without the page")
    p.add_argument("--gpus", default="", metavar="IDS", help="GPUs the queue may use, e.g. 0,1,2,3 (default: every "
                   "visible GPU; none: one CPU slot)")
    p.add_argument("--state-dir", default="", help="folder of the studio's state: the queue file and the API tokens "
                   "(default <runs-dir>/.studio-state)")
    p.add_argument("--new-token", default="", metavar="NAME", help="create an API token, print it and exit")
    p.add_argument("--scope", default="write", choices=("read", "write"), help="the new token's scope (default write)")
    p.add_argument("--max-upload-mb", type=int, default=512, help="largest file the page accepts (default 512 MB)")
    return p


def _host_guard(host: str, share: bool, max_upload_mb: int = 512) -> list:
    """Only the host names the studio was started for; with --auth, only the login form for strangers;
    writes only from the studio's own page, uploads size-capped (gui/upload_guard.py)."""
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from gui.login_gate import LoginOnlyForStrangers
    from gui.upload_guard import SameOriginWrites
    return [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts(host, share)),
            Middleware(SameOriginWrites, max_upload_mb=max_upload_mb), Middleware(LoginOnlyForStrangers)]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.new_token:
        from gui.queue_server import new_token
        return new_token(args, Path(args.runs_dir).expanduser())
    host = "0.0.0.0" if args.listen else args.host
    try:
        auth = parse_auth(args.auth) if args.auth else None
        warning = check_exposure(host, args.share, auth, args.allow_unauthenticated)
    except SecurityError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if warning:
        print(warning, file=sys.stderr)

    runs_dir = Path(args.runs_dir).expanduser()
    runs_dir.mkdir(parents=True, exist_ok=True)
    from gui.queue_server import api_routes, queue_settings, serve_headless
    from trainer_backend.jobqueue import JobQueue, QueueFileError
    try:
        queue = JobQueue(queue_settings(args, runs_dir)).start()   # re-adopts the jobs still running
    except (QueueFileError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.headless:
        return serve_headless(queue, host, args.port, args.root_path, _host_guard(host, args.share, args.max_upload_mb))

    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    from gui.shared_state import Settings, Studio
    from gui.studio import CSS, TITLE, build_app
    from gui.system_monitor import gpu_count

    datasets_dir = Path(args.datasets_dir).expanduser().resolve()
    datasets_dir.mkdir(parents=True, exist_ok=True)
    dataset_roots = [Path(d).expanduser().resolve() for d in args.allow_dataset_dir]
    settings = Settings(runs_dir=runs_dir, presets_dir=Path(args.presets_dir).expanduser() if args.presets_dir
                        else None, initial_preset=args.preset, stop_timeout_s=args.stop_timeout,
                        allowed_output_dirs=[Path(d).expanduser() for d in args.allow_output_dir],
                        datasets_dir=datasets_dir, dataset_roots=dataset_roots)
    studio = Studio.create(settings, gpu_count=gpu_count(), queue=queue)
    app = build_app(studio)
    app.queue(default_concurrency_limit=4)
    _close_on_signals()
    print(f"{TITLE}: http://{'127.0.0.1' if host == '0.0.0.0' else host}:{args.port}{args.root_path or ''}/"
          f"  (runs in {runs_dir.resolve()})", flush=True)
    app.launch(server_name=host, server_port=args.port, auth=auth, share=args.share,
               root_path=args.root_path or None, allowed_paths=[str(runs_dir.resolve()), str(datasets_dir),
                                                                  *(str(d) for d in dataset_roots),
                                                                  *(str(Path(d).expanduser().resolve()) for d in args.allow_output_dir)],
               inbrowser=args.inbrowser, css=CSS, theme="soft", show_error=True, quiet=True,
               footer_links=["api", "settings"], app_kwargs={"middleware": _host_guard(host, args.share, args.max_upload_mb),
                                                         "routes": api_routes(queue)},
               max_file_size=f"{args.max_upload_mb}mb",
               # Gradio's self-check gives the server one 3 s HEAD request and exits when it is late,
               # which happens while a training run keeps the CPU busy; the studio never needs the
               # share-link fallback that check exists for
               _frontend=False)
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _close_on_signals() -> None:
    """SIGINT and SIGTERM close the server and exit normally, so the studio's exit handlers run (they
    end the TensorBoards it started): SIGINT even when the studio was started with it ignored (nohup,
    a launcher's background job, pytest-xdist's workers), SIGTERM as a service manager sends it."""
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
