"""The REST API under /api/v1: FastAPI routes on the studio's own server (mounted on Gradio's app,
or alone with `--headless`), OpenAPI at /api/v1/docs. Every route needs a token
(`Authorization: Bearer …`): 401 without a valid one, 403 when a read token asks to change something."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from trainer_backend.config import ConfigError
from trainer_backend.run.contract import CONSOLE_LOG, CONTROL_DIR, EVENTS_FILE

from .service import ConfigProblems, JobQueue
from .store import FINISHED
from .tokens import check_token

PREFIX = "/api/v1"
HIDDEN = (CONTROL_DIR, "checkpoints", "tb", "jobs")   # not outputs: state, control files, TensorBoard, after-run jobs


class Submit(BaseModel):
    config_toml: str = Field(description="a config (or a sparse preset) as TOML, over the studio's defaults")
    priority: int = Field(0, description="higher runs earlier; equal priorities keep submission order")
    front: bool = Field(False, description="put it before every waiting job (the page's Start)")


class SampleStrengths(BaseModel):
    source: str = Field("", description="an adapter file or one of the run's checkpoints/step-… folders, inside "
                                        "the run or the studio's run folders (default: the run's output)")
    strengths: str = Field("0.5,0.75,1,1.25", description="comma-separated strengths; 0 is the base model")


class Move(BaseModel):
    where: str = Field(pattern="^(up|down|top|bottom)$")


def _auth(scope: str):
    def need(request: Request) -> str:
        header = request.headers.get("authorization", "")
        kind, _, token = header.partition(" ")
        found = check_token(request.app.state.queue.store, token.strip()) if kind.lower() == "bearer" else None
        if found is None:
            raise HTTPException(401, "a valid API token is needed: Authorization: Bearer <token> "
                                     "(python app.py --new-token NAME)", headers={"WWW-Authenticate": "Bearer"})
        if scope == "write" and found[1] != "write":
            raise HTTPException(403, f"token '{found[0]}' is read-only; this needs a write token")
        return found[0]
    return need


READ, WRITE = Depends(_auth("read")), Depends(_auth("write"))


def _job(queue: JobQueue, job_id: int):
    try:
        return queue.get(job_id)
    except LookupError as e:
        raise HTTPException(404, str(e)) from None


def _conflict(e: ConfigError) -> HTTPException:
    return HTTPException(409, str(e))


def build_api(queue: JobQueue) -> FastAPI:
    """The API as an app of its own, mounted at /api/v1 (its docs at /api/v1/docs)."""
    api = FastAPI(title="SD Training Studio API", version="1", docs_url="/docs", openapi_url="/openapi.json",
                  redoc_url=None, description="Jobs in the studio's queue. Every route needs a token.")
    api.state.queue = queue

    @api.get("/jobs", summary="every job: waiting in queue order, then the others newest first")
    def list_jobs(status: str | None = Query(None, description="comma-separated statuses"),
                  limit: int | None = Query(None, ge=1), _=READ):
        statuses = tuple(s for s in status.split(",") if s) if status else None
        # plain data already: json.dumps directly (FastAPI's jsonable_encoder took 60 ms for 1,000 jobs)
        return Response(json.dumps({"jobs": queue.jobs(statuses, limit), "paused": queue.store.paused}),
                        media_type="application/json")

    @api.post("/jobs", summary="submit a training job", status_code=201)
    def submit(body: Submit, who: str = WRITE):
        try:
            job = queue.submit(body.config_toml, priority=body.priority, front=body.front, submitted_by=who)
        except ConfigProblems as e:
            return JSONResponse({"detail": [{"key": p.key, "message": p.message} for p in e.problems]}, 422)
        except ConfigError as e:
            key, _, message = str(e).partition(": ")
            return JSONResponse({"detail": [{"key": key, "message": message}]}, 422)
        return {"id": job.id, "run_dir": job.run_dir, "status": job.status}

    @api.post("/runs/{name}/sample-strengths", status_code=201,
              summary="a job drawing the run's LoRA (or a checkpoint) at several strengths into its sample grid")
    def sample_strengths(name: str, body: SampleStrengths, _=WRITE):
        from trainer_backend.lora_tools.jobs import queue_sample_job
        run_dir = _run_folder(queue, name)
        source = _inside(queue, run_dir, body.source) if body.source else ""
        try:
            job = queue_sample_job(queue, run_dir, source, body.strengths)
        except ConfigError as e:
            key, _, message = str(e).partition(": ")
            return JSONResponse({"detail": [{"key": key, "message": message}]}, 422)
        return {"id": job.id, "run_dir": job.run_dir, "status": job.status}

    @api.get("/jobs/{job_id}", summary="one job: status, step, total, loss, it/s, ETA, GPUs")
    def get_job(job_id: int, _=READ):
        return queue.describe(_job(queue, job_id))

    @api.post("/jobs/{job_id}/stop", summary="save state, then stop")
    def stop(job_id: int, _=WRITE):
        _job(queue, job_id)
        try:
            return queue.describe(queue.stop(job_id))
        except ConfigError as e:
            raise _conflict(e) from None

    @api.post("/jobs/{job_id}/checkpoint", summary="save a checkpoint after the current step")
    def checkpoint(job_id: int, _=WRITE):
        _job(queue, job_id)
        try:
            return queue.describe(queue.checkpoint(job_id))
        except ConfigError as e:
            raise _conflict(e) from None

    @api.delete("/jobs/{job_id}", summary="remove a waiting job")
    def delete(job_id: int, _=WRITE):
        _job(queue, job_id)
        try:
            return {"deleted": queue.delete(job_id).id}
        except ConfigError as e:
            raise _conflict(e) from None

    @api.post("/jobs/{job_id}/retry", summary="put a failed, stopped or interrupted job back in the queue")
    def retry(job_id: int, _=WRITE):
        _job(queue, job_id)
        try:
            return queue.describe(queue.retry(job_id))
        except ConfigError as e:
            raise _conflict(e) from None

    @api.post("/jobs/{job_id}/move", summary="reorder a waiting job: up, down, top, bottom")
    def move(job_id: int, body: Move, _=WRITE):
        _job(queue, job_id)
        try:
            return queue.describe(queue.move(job_id, body.where))
        except ConfigError as e:
            raise _conflict(e) from None

    @api.post("/queue/pause", summary="start no new job (running ones go on)")
    def pause(_=WRITE):
        queue.set_paused(True)
        return {"paused": True}

    @api.post("/queue/resume", summary="start waiting jobs again")
    def resume(_=WRITE):
        queue.set_paused(False)
        return {"paused": False}

    @api.get("/jobs/{job_id}/log", summary="the job's console output from line `after` on")
    def log(job_id: int, after: int = Query(0, ge=0), _=READ):
        job = _job(queue, job_id)
        lines = _read_lines(Path(job.run_dir) / CONSOLE_LOG)
        return {"lines": lines[after:], "next": len(lines), "status": job.status}

    @api.get("/jobs/{job_id}/events", summary="events.jsonl as server-sent events, until the job ends")
    async def events(job_id: int, after: int = Query(0, ge=0), _=READ):
        job = _job(queue, job_id)
        return StreamingResponse(_event_stream(queue, job.id, Path(job.run_dir) / EVENTS_FILE, after),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    @api.get("/jobs/{job_id}/files", summary="the run's output files: names and sizes")
    def files(job_id: int, _=READ):
        return {"files": _outputs(Path(_job(queue, job_id).run_dir))}

    @api.get("/jobs/{job_id}/files/{name:path}", summary="one output file's bytes")
    def file(job_id: int, name: str, _=READ):
        run_dir = Path(_job(queue, job_id).run_dir).resolve()
        if name not in {f["name"] for f in _outputs(run_dir)}:
            raise HTTPException(404, f"{name}: not an output file of job {job_id}")
        return FileResponse(run_dir / name, filename=Path(name).name)

    return api


def _run_folder(queue: JobQueue, name: str) -> Path:
    """A finished run under --runs-dir by its name (404 otherwise)."""
    import re
    run_dir = queue.runs_dir / name
    if not re.fullmatch(r"[\w.-]+", name) or name.startswith(".") or not (run_dir / "config.toml").is_file():
        raise HTTPException(404, f"{name}: no run of that name in {queue.runs_dir}")
    return run_dir


def _inside(queue: JobQueue, run_dir: Path, path: str) -> str:
    """A path the API may read: inside the run or a folder the studio writes runs into (403 otherwise)."""
    found = (run_dir / path).resolve()
    if not any(found == root or found.is_relative_to(root) for root in (run_dir.resolve(), *queue.allowed_roots)):
        raise HTTPException(403, f"{path}: outside the run and the studio's run folders")
    if not found.exists():
        raise HTTPException(404, f"{path}: no such file or folder")
    return str(found)


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def _outputs(run_dir: Path) -> list[dict]:
    """Regular files inside the run folder (no symlinks, nothing under control/, checkpoints/, tb/)."""
    found = []
    if not run_dir.is_dir():
        return found
    root = run_dir.resolve()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if rel.parts[0] in HIDDEN or path.is_symlink() or not path.is_file():
            continue
        found.append({"name": rel.as_posix(), "size": path.stat().st_size})
    return found


async def _event_stream(queue: JobQueue, job_id: int, path: Path, after: int):
    """Each events.jsonl line from `after` on as `id: N` + `data: {…}`; ends once the job has ended
    and every line is sent; a comment every 15 s keeps proxies from closing the connection."""
    sent, quiet = after, 0.0
    while True:
        lines = _read_lines(path)
        for n in range(sent, len(lines)):
            try:
                json.loads(lines[n])
            except ValueError:
                break          # a line still being written
            yield f"id: {n + 1}\ndata: {lines[n]}\n\n"
            sent, quiet = n + 1, 0.0
        if queue.store.get(job_id).status in FINISHED and sent >= len(_read_lines(path)):
            yield "event: end\ndata: {}\n\n"
            return
        await asyncio.sleep(0.5)
        quiet += 0.5
        if quiet >= 15:
            quiet = 0.0
            yield ": still running\n\n"
