"""What the studio writes and accepts from outside (issue 37 items 9 and 10): a link placed in the
runs folder cannot carry a run outside the allowed folders; an upload from another web site is
refused, and an upload from the studio's own page is size-capped."""
from __future__ import annotations

import os

import pytest

from conftest import make_dataset
from trainer_backend.config import ConfigError, load_config


def test_a_link_in_the_runs_folder_cannot_lead_a_run_outside(tmp_path):
    from gui.run_control import RunManager
    runs, elsewhere = tmp_path / "runs", tmp_path / "elsewhere"
    runs.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, runs / "linkout")
    os.symlink(runs / "loop", runs / "loop")
    data = make_dataset(tmp_path / "data", n=1, size=32)
    manager = RunManager(runs, cwd=tmp_path)
    for name, leads in (("linkout", str(elsewhere)), ("loop", "a link loop")):
        cfg = load_config(None, ["model.path='builtin:tiny-sd1'", f"dataset.path='{data}'", f"output.dir='{runs}'",
                                 f"output.name='{name}'"])
        with pytest.raises(ConfigError) as e:
            manager.start(cfg)
        assert str(e.value).startswith(f"output.name: {runs / name} leads to {leads} through a link, outside")
    assert list(elsewhere.iterdir()) == []  # nothing was written there
    # a link that stays inside the runs folder is a folder like any other
    (runs / "real").mkdir()
    os.symlink(runs / "real", runs / "alias")
    manager._check_allowed(runs / "alias")


def _upload(url: str, content: bytes, headers: dict[str, str]) -> tuple[int, str]:
    import urllib.error
    import urllib.request
    boundary = "----studio-test-boundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"fill.bin\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + content + f"\r\n--{boundary}--\r\n".encode()
    request = urllib.request.Request(url + "gradio_api/upload", data=body, method="POST",
                                     headers={"Content-Type": f"multipart/form-data; boundary={boundary}", **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def _stored(folder, content: bytes) -> bool:
    return any(p.is_file() and p.read_bytes() == content for p in folder.rglob("*"))


def test_uploads_from_another_site_are_refused_and_sizes_capped(tmp_path, monkeypatch):
    """A real studio and real HTTP POSTs to gradio's upload route: another site's page (Origin, or
    only a Referer) gets 403 and nothing is stored; the studio's own page (same Origin) and clients
    that send no Origin (gradio_client, curl) upload; an upload over --max-upload-mb is 413."""
    from test_browser_studio import Server
    uploads = tmp_path / "gradio-tmp"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(uploads))
    server = Server(tmp_path, ("--max-upload-mb", "1")).start()
    try:
        origin = server.url.rstrip("/")
        for n, headers in enumerate(({"Origin": "http://evil.example"}, {"Referer": "https://evil.example/page"},
                                     {"Origin": "null"}, {"Origin": origin.replace("127.0.0.1", "localhost")})):
            content = f"cross-site payload {n}".encode()
            code, answer = _upload(server.url, content, headers)
            assert code == 403 and "cross-site request refused" in answer, (headers, code, answer)
            assert not _stored(uploads, content)
        for n, headers in enumerate(({"Origin": origin}, {"Referer": server.url}, {})):
            content = f"own page upload {n}".encode()
            code, answer = _upload(server.url, content, headers)
            assert code == 200, (headers, code, answer)
            assert _stored(uploads, content)
        code, answer = _upload(server.url, b"x" * (2 * 1024 * 1024), {"Origin": origin})
        assert code == 413 and "1 MB" in answer
        assert not _stored(uploads, b"x" * (2 * 1024 * 1024))
    finally:
        server.stop()
