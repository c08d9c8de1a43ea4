"""Webhooks against a real local HTTP server: the right events arrive in order with the right
fields (JSON with an auth header from the secrets; Discord with the sample image attached),
and a slow or dead URL does not hold training up."""
from __future__ import annotations

import json
from email.parser import BytesParser
from email.policy import HTTP

import pytest

from checkpoint_harness import Recorder, child_env, fast_inputs, read_events, write_config, zygote  # noqa: F401
from conftest import free_port
from trainer_backend.remote.webhooks import build_payload, discord_message

TOKEN = "Bearer hook-TOKEN-5up3rs3cr3t"
FIELDS = ("run", "run_id", "event", "step", "total_steps", "epoch", "loss", "lr", "eta_s", "elapsed_s", "timestamp")


@pytest.fixture
def recorder():
    r = Recorder()
    yield r
    r.close()


def _json(request: dict) -> dict:
    return json.loads(request["body"])


def _multipart(request: dict) -> dict[str, tuple[str | None, bytes]]:
    """name -> (filename, bytes) of a multipart/form-data body."""
    raw = f"Content-Type: {request['headers']['Content-Type']}\r\n\r\n".encode() + request["body"]
    message = BytesParser(policy=HTTP).parsebytes(raw)
    return {part.get_param("name", header="content-disposition"): (part.get_filename(), part.get_payload(decode=True))
            for part in message.iter_parts()}


def test_events_arrive_in_order_with_fields(recorder, zygote, fast_inputs, tmp_path):
    discord_path = "/discord/api/webhooks/123/t0ken-in-the-url"
    config = write_config(tmp_path / "w.toml", *fast_inputs, tmp_path / "runs", "hooked", {
        "checkpoints": {"every_n_steps": 4, "keep_every_n_steps": 0},
        "samples": {"prompts": "a red square", "every_n_steps": 6, "steps": 2, "width": 32, "height": 32},
        "webhooks": {"targets": [
            {"url": f"{recorder.url}/json", "auth_secret": "HOOK_TOKEN"},
            {"url_secret": "DISCORD_URL", "format": "discord", "events": ["sample", "done"]},
        ]},
    })
    log = tmp_path / "w.log"
    env = child_env(HOOK_TOKEN=TOKEN, DISCORD_URL=recorder.url + discord_path)
    assert zygote.run(config, log, env=env) == 0, log.read_text()[-3000:]
    run = tmp_path / "runs" / "hooked"
    events = read_events(run)

    hooks = [_json(r) for r in recorder.at("/json")]
    sent_kinds = ("start", "checkpoint", "sample", "epoch", "done")
    expected = [e["event"] for e in events if e["event"] in sent_kinds]
    assert [h["event"] for h in hooks] == expected  # every event, in order
    assert expected[0] == "start" and expected[-1] == "done" and "sample" in expected
    assert all(r["headers"]["Authorization"] == TOKEN for r in recorder.at("/json"))
    for hook in hooks:
        assert set(FIELDS) <= hook.keys() and hook["run"] == "hooked" and hook["total_steps"] == 12
    assert len({h["run_id"] for h in hooks}) == 1 and hooks[0]["run_id"]
    checkpoints = [h for h in hooks if h["event"] == "checkpoint"]
    assert [h["step"] for h in checkpoints] == [4, 8, 12]
    assert all(h["path"].endswith(f"step-{h['step']:08d}") and "remote" in h for h in checkpoints)
    assert [h["epoch"] for h in hooks if h["event"] == "epoch"] == [1, 2, 3]
    assert isinstance(checkpoints[-1]["loss"], float) and isinstance(checkpoints[-1]["lr"], float)
    assert hooks[-1]["outputs"] and hooks[-1]["step"] == 12

    discord = recorder.at(discord_path)
    samples = [e for e in events if e["event"] == "sample"]
    assert len(discord) == len(samples) + 1  # the samples and done only (its events list)
    parts = _multipart(discord[0])
    message = json.loads(parts["payload_json"][1])
    assert "sample" in message["content"] and "hooked" in message["content"]
    filename, image = parts["files[0]"]
    assert filename.endswith(".png") and image.startswith(b"\x89PNG")
    done = _json(discord[-1])
    assert "done" in done["content"] and done["embeds"][0]["fields"]

    text = (run / "train.log").read_text() + log.read_text() + (run / "events.jsonl").read_text()
    assert TOKEN not in text and "t0ken-in-the-url" not in text


def test_slow_and_dead_urls_do_not_hold_training(recorder, zygote, fast_inputs, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/nobody-listens"
    config = write_config(tmp_path / "s.toml", *fast_inputs, tmp_path / "runs", "slowhooks", {
        "checkpoints": {"every_n_steps": 4, "keep_every_n_steps": 0},
        "webhooks": {"timeout_s": 1.0, "retries": 1,
                     "targets": [{"url": f"{recorder.url}/slow"}, {"url": dead}]},
    })
    log = tmp_path / "s.log"
    assert zygote.run(config, log, env=child_env()) == 0, log.read_text()[-3000:]
    # the server held the first request (the `start` webhook) the whole time: training and the
    # process ended anyway, the slow URL's requests timing out and the dead URL's failing
    assert recorder.held.is_set() and not recorder.release_event.is_set()
    events = read_events(tmp_path / "runs" / "slowhooks")
    assert [e["step"] for e in events if e["event"] == "step"] == list(range(1, 13))
    assert events[-1]["event"] == "done"
    text = (tmp_path / "runs" / "slowhooks" / "train.log").read_text()
    for label in (recorder.url, dead.rsplit("/", 1)[0]):
        assert text.count(f"webhook {label}: ") >= 1  # reported (the per-URL summary at the end)
        assert text.count(f"webhook {label}: ") <= 2  # once when it first fails, once summarised
    assert "nobody-listens" not in text  # URLs are logged by host only (paths may hold tokens)


def test_payload_and_discord_message_shapes():
    record = {"event": "checkpoint", "time": 1700000000.0, "step": 40, "path": "/r/checkpoints/step-00000040",
              "remote": "s3://b/p/r/checkpoints/step-00000040/"}
    status = {"step": 40, "total_steps": 100, "epoch": 2, "loss": 0.125, "lr": 1e-4, "eta_s": 75.0}
    payload = build_payload("checkpoint", record, status, "dog", "abc123", started=1699999000.0)
    assert {k: payload[k] for k in ("run", "run_id", "event", "step", "total_steps", "epoch", "loss")} == {
        "run": "dog", "run_id": "abc123", "event": "checkpoint", "step": 40, "total_steps": 100, "epoch": 2,
        "loss": 0.125}
    assert payload["remote"].startswith("s3://") and payload["timestamp"].startswith("2023-11-14T22:13:20")
    message = discord_message(payload)
    assert message["content"] == "dog: checkpoint at step 40/100"
    names = [f["name"] for f in message["embeds"][0]["fields"]]
    assert names[:4] == ["epoch", "loss", "lr", "ETA"] and "remote" in names


def test_preempted_and_error_reach_the_webhook(recorder, zygote, fast_inputs, tmp_path):
    """A SIGTERM sends `preempted` (after its checkpoint); a run that then fails writing its next
    checkpoint (file-size limit, as on a full disk) sends `error` with the message."""
    import signal
    from checkpoint_harness import wait_for_event
    config = write_config(tmp_path / "p.toml", *fast_inputs, tmp_path / "runs", "interrupted", {
        "webhooks": {"targets": [{"url": f"{recorder.url}/json", "events": ["preempted", "error", "checkpoint"]}]}})
    run = tmp_path / "runs" / "interrupted"
    child = zygote.spawn(config, tmp_path / "p.log")
    assert wait_for_event(run, child, lambda e: e["event"] == "step" and e["step"] >= 3) is not None
    child.signal(signal.SIGTERM)
    assert child.wait() == 75
    hooks = [_json(r) for r in recorder.at("/json")]
    assert hooks[-1]["event"] == "preempted" and hooks[-2]["event"] == "checkpoint"
    assert hooks[-1]["step"] == hooks[-2]["step"] and hooks[-1]["run"] == "interrupted"

    size = (run / "checkpoints" / f"step-{hooks[-1]['step']:08d}" / "optimizer.bin").stat().st_size
    assert zygote.run(config, tmp_path / "e.log", fsize=size * 2 // 3) == 1
    error = _json(recorder.at("/json")[-1])
    assert error["event"] == "error" and "could not write checkpoint" in error["message"]
    assert error["step"] == hooks[-1]["step"] + 1  # the last step reported before the failure
