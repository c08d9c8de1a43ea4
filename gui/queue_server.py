"""The queue in the studio's process: its worker, the API mounted at /api/v1 on Gradio's app, and
`--headless` (the worker and the API alone, no page and no gradio import), plus `--new-token`."""
from __future__ import annotations

import sys
from pathlib import Path

from trainer_backend.jobqueue import JobQueue, QueueSettings
from trainer_backend.jobqueue.slots import parse_gpus


def queue_settings(args, runs_dir: Path) -> QueueSettings:
    from gui.system_monitor import gpu_count
    return QueueSettings(runs_dir=runs_dir, state_dir=Path(args.state_dir).expanduser() if args.state_dir else None,
                         allowed_output_dirs=[Path(d).expanduser() for d in args.allow_output_dir],
                         gpu_slots=parse_gpus(args.gpus, gpu_count()), stop_timeout_s=args.stop_timeout)


def api_routes(queue: JobQueue) -> list:
    """The API as a route of the server's app (gradio's App takes `routes` through app_kwargs)."""
    from starlette.routing import Mount
    from trainer_backend.jobqueue.api import PREFIX, build_api
    return [Mount(PREFIX, app=build_api(queue))]


def new_token(args, runs_dir: Path) -> int:
    """`--new-token NAME [--scope read|write]`: prints the token once, as the last word of the last line."""
    from trainer_backend.config import ConfigError
    from trainer_backend.jobqueue.store import QueueStore
    from trainer_backend.jobqueue.tokens import new_token as make
    settings = queue_settings(args, runs_dir)
    try:
        store = QueueStore(settings.queue_file)
        token = make(store, args.new_token, args.scope)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.scope} token '{args.new_token}' created (kept only as a hash in {settings.queue_file}; "
          "it is shown this once):")
    print(f"token: {token}")
    return 0


def serve_headless(queue: JobQueue, host: str, port: int, root_path: str, middleware: list) -> int:
    """The worker and the API without the page: for servers and containers."""
    import uvicorn
    from fastapi import FastAPI
    app = FastAPI(title="SD Training Studio (headless)", docs_url=None, redoc_url=None, openapi_url=None,
                  routes=api_routes(queue), middleware=middleware)
    print(f"SD Training Studio, headless: API at http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
          f"{root_path}/api/v1/docs (queue {queue.settings.queue_file})", flush=True)
    uvicorn.run(app, host=host, port=port, root_path=root_path, log_level="warning")
    return 0
