"""Never lose a user's files or a run (issue 17, studio side): a stranger sees only the login
form; runs write only inside the studio's folders and never into a folder that is not a run;
Delete removes only what a run wrote and leaves Start working; a failed run shows its error;
one enormous image never breaks the Training page."""
from __future__ import annotations

import http.cookiejar
import os
import struct
import threading
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path

import pytest

from test_browser_studio import Server
from trainer_backend.run.run_folder import MARKER, claim

ROOT = Path(__file__).resolve().parent.parent
USER, PASSWORD = "ada", "correct-horse-42"


def _get(opener, url: str) -> tuple[int, str]:
    try:
        with opener.open(url, timeout=30) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def test_a_stranger_sees_only_the_login_and_runs_stay_inside_the_studios_folders(tmp_path):
    """Items 11, 8 and 1 through the real server: without a session, / is a login form with no API
    description and no preset values, and the rest answers 401. Logged in, start_from_toml refuses
    output.dir = /etc (outside --runs-dir and --allow-output-dir) and a user's folder inside an allowed
    folder (not a run), and writes nothing there."""
    from gradio_client import Client
    extra = tmp_path / "v"
    docs = extra / "Docs"
    docs.mkdir(parents=True)
    (docs / "letter.txt").write_text("mine")
    server = Server(tmp_path, ("--auth", f"{USER}:{PASSWORD}", "--allow-output-dir", str(extra))).start()
    try:
        stranger = urllib.request.build_opener()
        code, page = _get(stranger, server.url)
        assert code == 200 and 'name="password"' in page
        for leak in ("demo_dataset", "start_from_toml", str(server.runs), "gradio_api", "dependencies"):
            assert leak not in page, f"the login page shows {leak!r}"
        for path in ("config", "gradio_api/info", "openapi.json", "gradio_api/openapi.json"):
            assert _get(stranger, server.url + path)[0] == 401, path

        jar = http.cookiejar.CookieJar()
        user = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        body = urllib.parse.urlencode({"username": USER, "password": PASSWORD}).encode()
        assert user.open(server.url + "login", data=body, timeout=30).status == 200
        code, page = _get(user, server.url)
        assert code == 200 and "start_from_toml" in page

        client = Client(server.url, auth=(USER, PASSWORD), verbose=False)

        def start(output_dir: str, name: str) -> str:
            toml = (f'[output]\ndir = "{output_dir}"\nname = "{name}"\n[model]\npath = "builtin:tiny-sd1"\n'
                    f'[dataset]\npath = "{ROOT / "assets" / "demo_dataset"}"\n[schedule]\nmax_steps = 1\n')
            return client.predict(toml, api_name="/start_from_toml")

        answer = start("/etc", "studio-run-17")
        assert answer.startswith("error: output.dir:") and "--allow-output-dir" in answer, answer
        assert not Path("/etc/studio-run-17").exists()
        answer = start(str(extra), "Docs")
        assert answer.startswith("error: output.name:") and "not a run folder" in answer, answer
        assert sorted(p.name for p in docs.iterdir()) == ["letter.txt"]
    finally:
        server.stop()
        server.kill_trainers()


def test_a_failed_run_shows_its_error_and_delete_keeps_start_working(tmp_path):
    """Items 10 and 9 with real trainer processes: a run that fails before its first step (a dataset
    whose only image does not decode, exit 2: an empty folder Start itself refuses, issue 29 item 2) is
    shown as an error, not "interrupted (resumable)"; after Delete, the next Start works (it used to
    fail until the studio restarted)."""
    from trainer_backend.config import from_dict, to_dict
    from gui.runs_page import runs_table
    from gui.run_state import run_status
    from gui.shared_state import Settings, Studio
    studio = Studio.create(Settings(runs_dir=tmp_path / "runs", presets_dir=tmp_path / "presets"))
    empty = tmp_path / "empty-dataset"
    empty.mkdir()
    (empty / "photo.png").write_text("not an image")   # an image by name: the scan in the trainer refuses it
    data = to_dict(studio.load_preset("demo-sd1-lora (built-in)"))
    data["dataset"]["path"] = str(empty)
    data["output"]["name"] = "first"
    manager = studio.manager
    run_dir = manager.start(from_dict(data))
    try:
        # exit 2 from the trainer; `accelerate launch` reports any failure as 1
        assert manager.children[run_dir].wait(timeout=300) in (1, 2), (run_dir / "console.log").read_text()[-2000:]
        table = runs_table(studio)
        row = table[table["run"] == "first"].iloc[0]
        assert row["status"].startswith("error") and "interrupted" not in row["status"], row["status"]
        assert "dataset" in row["status"]
        assert run_status(run_dir).status == "error"
        assert manager.delete(run_dir) == f"deleted {run_dir}"
        assert not run_dir.exists()
        data["output"]["name"] = "second"
        second = manager.start(from_dict(data))
        assert manager.children[second].wait(timeout=300) in (1, 2)
    finally:
        for proc in manager.children.values():
            if proc.poll() is None:
                proc.kill()


def test_delete_removes_only_what_the_run_wrote(tmp_path):
    """Item 1: Delete needs the run's marker; files the run did not write stay."""
    from gui.run_control import RunManager, StartRefused, is_run_dir
    manager = RunManager(tmp_path)
    run = claim(tmp_path / "mine")
    (run / "config.toml").write_text("")
    (run / "events.jsonl").write_text("")
    (run / "checkpoints" / "step-00000001").mkdir(parents=True)
    (run / "mine.safetensors").write_bytes(b"x")
    (run / "notes-i-added.txt").write_text("keep me")
    message = manager.delete(run)
    assert "kept 1" in message and "notes-i-added.txt" in message
    assert sorted(p.name for p in run.iterdir()) == ["notes-i-added.txt"]
    # a folder that looks like a run to older studios but holds a user's files: not a run, never deleted
    docs = tmp_path / "Docs"
    docs.mkdir()
    for name in ("config.toml", "events.jsonl", "taxes.pdf"):
        (docs / name).write_text("x")
    assert not is_run_dir(docs)
    with pytest.raises(StartRefused):
        manager.delete(docs)
    assert len(list(docs.iterdir())) == 3 and not (docs / MARKER).exists()


def _png_header_claiming(path: Path, width: int, height: int) -> None:
    """A tiny PNG file whose header claims width × height pixels (PIL reads the size from it)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16))
                     + chunk(b"IEND", b""))


def test_thumbnails_skip_enormous_images_and_fifos(tmp_path):
    """Item 12: one image over PIL's ~179-megapixel bomb limit (or over dataset.max_image_megapixels),
    and a FIFO named like an image, leave the other thumbnails showing instead of breaking the page."""
    from gui.dataset_view import thumbnails
    from conftest import make_dataset
    data = make_dataset(tmp_path / "data", n=2, size=32)
    _png_header_claiming(data / "bomb.png", 20000, 10000)     # 200 MP: PIL refuses it with an exception
    _png_header_claiming(data / "big.png", 12000, 10000)      # 120 MP: over the trainer's default 100
    os.mkfifo(data / "pipe.png")
    result: list = []
    worker = threading.Thread(target=lambda: result.append(thumbnails({"subsets": [{"path": str(data)}]})),
                              daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():   # release the FIFO's reader so the test ends
        os.close(os.open(data / "pipe.png", os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("thumbnails blocked on a FIFO")
    assert [caption for _, caption in result[0]] == ["img000.png", "img001.png"]
