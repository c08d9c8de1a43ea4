"""S3-compatible sync against a real S3 endpoint on 127.0.0.1 (moto's server, started here):
checkpoints and outputs reach the bucket, remote retention deletes old ones, a fresh machine
(an empty directory, same config) resumes from the bucket and ends with the weights of an
uninterrupted run, and an endpoint that stops answering mid-run delays nothing: uploads retry
and catch up."""
from __future__ import annotations

import json
import signal

import pytest

from checkpoint_harness import (ACCESS_KEY, SECRET_KEY, MotoServer, assert_bitwise_equal, cloud_section,  # noqa: F401
                                env_without_aws, fast_inputs, lora_tensors, read_events, reference_run,
                                valid_steps, wait_for_event, write_config, write_secrets_file, zygote)
from trainer_backend.run import exitcodes

PREFIX = "team/runs"


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.close()


@pytest.fixture
def secrets_file(tmp_path):
    return write_secrets_file(tmp_path / "secrets.env", AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)


def _complete_remote_steps(moto, bucket, name) -> list[int]:
    keys = moto.keys(bucket, f"{PREFIX}/{name}/checkpoints/")
    steps = []
    for key in keys:
        if key.endswith("/manifest.json"):
            steps.append(int(key.split("/")[-2][len("step-"):]))
    return sorted(steps)


def test_bucket_gets_checkpoints_and_outputs_and_a_fresh_machine_resumes(
        moto, secrets_file, zygote, reference_run, fast_inputs, tmp_path):
    bucket = moto.make_bucket("fresh-machine")
    cloud = cloud_section(moto, bucket, secrets_file, keep_last=1)
    name = "spot"
    # machine 1: trains, uploads in the background, and vanishes (SIGKILL) half way
    config1 = write_config(tmp_path / "m1.toml", *fast_inputs, tmp_path / "machine1", name, {"cloud": cloud})
    run1 = tmp_path / "machine1" / name
    child = zygote.spawn(config1, tmp_path / "m1.log", env=env_without_aws())
    uploaded = wait_for_event(run1, child, lambda e: e["event"] == "upload" and e["status"] == "done"
                              and e.get("step", 0) >= 5)
    assert uploaded is not None, (tmp_path / "m1.log").read_text()[-3000:]
    child.signal(signal.SIGKILL)
    child.wait()
    remote_before = _complete_remote_steps(moto, bucket, name)
    assert remote_before and max(remote_before) >= 5
    # a partial upload (no manifest) that looks newest must never be chosen
    moto.client().put_object(Bucket=bucket, Key=f"{PREFIX}/{name}/checkpoints/step-00000099/optimizer.bin",
                             Body=b"partial")

    # machine 2: an empty directory, the same config
    config2 = write_config(tmp_path / "m2.toml", *fast_inputs, tmp_path / "machine2", name, {"cloud": cloud})
    run2 = tmp_path / "machine2" / name
    rc = zygote.run(config2, tmp_path / "m2.log", env=env_without_aws())
    assert rc == 0, (tmp_path / "m2.log").read_text()[-3000:]
    events = read_events(run2)
    resumed = [e for e in events if e["event"] == "resumed"]
    assert resumed and resumed[0]["step"] == max(remote_before)
    assert_bitwise_equal(lora_tensors(run2 / f"{name}.safetensors"), reference_run["lora"])
    assert "resuming from the bucket" in (run2 / "train.log").read_text()

    # the bucket: retention (keep_last=1 plus every 4th step) mirrored remotely, no partial
    # folder left, and the outputs and run files
    assert _complete_remote_steps(moto, bucket, name) == [4, 8, 12]
    keys = moto.keys(bucket, f"{PREFIX}/{name}/")
    assert not [k for k in keys if "step-00000099" in k]
    for rel in (f"{name}.safetensors", "config.toml", "events.jsonl", "train.log"):
        assert f"{PREFIX}/{name}/{rel}" in keys
    uploads = [e for e in events if e["event"] == "upload"]
    assert any(e["status"] == "pruned" for e in uploads)
    body = moto.client().get_object(Bucket=bucket, Key=f"{PREFIX}/{name}/{name}.safetensors")["Body"].read()
    assert body == (run2 / f"{name}.safetensors").read_bytes()
    checkpoint_events = [e for e in events if e["event"] == "checkpoint"]
    assert checkpoint_events[-1]["remote"] == f"s3://{bucket}/{PREFIX}/{name}/checkpoints/step-00000012/"

    # an explicit s3:// path resumes that checkpoint in yet another empty directory
    url = f"s3://{bucket}/{PREFIX}/{name}/checkpoints/step-00000008/"
    config3 = write_config(tmp_path / "m3.toml", *fast_inputs, tmp_path / "machine3", "other-name",
                           {"checkpoints": {"resume": url},  # no bucket: no sync, just the endpoint
                            "cloud": {"endpoint_url": moto.url, "region": "us-east-1"}})
    rc = zygote.run(config3, tmp_path / "m3.log", env=env_without_aws(AWS_ACCESS_KEY_ID=ACCESS_KEY,
                                                                      AWS_SECRET_ACCESS_KEY=SECRET_KEY))
    assert rc == 0, (tmp_path / "m3.log").read_text()[-3000:]
    run3 = tmp_path / "machine3" / "other-name"
    assert [e["step"] for e in read_events(run3) if e["event"] == "resumed"] == [8]
    assert_bitwise_equal(lora_tensors(run3 / "other-name.safetensors"), reference_run["lora"])


def test_endpoint_outage_training_goes_on_and_uploads_catch_up(moto, secrets_file, zygote, fast_inputs,
                                                              tmp_path):
    bucket = moto.make_bucket("outage")
    name = "outage"
    config = write_config(tmp_path / "o.toml", *fast_inputs, tmp_path / "runs", name,
                          {"cloud": cloud_section(moto, bucket, secrets_file, keep_last=2)})
    run = tmp_path / "runs" / name
    log = tmp_path / "o.log"
    child = zygote.spawn(config, log, env=env_without_aws())
    assert wait_for_event(run, child, lambda e: e["event"] == "upload" and e["status"] == "done") is not None
    moto.pause()
    try:
        paused_at = max(e["step"] for e in read_events(run) if e["event"] == "step")
        # training goes on while the endpoint does not answer, and the uploader says it retries
        retry = wait_for_event(run, child, lambda e: e["event"] == "upload" and e["status"] == "retrying")
        assert retry is not None, log.read_text()[-3000:]
        assert wait_for_event(run, child, lambda e: e["event"] == "step" and e["step"] >= paused_at + 3) is not None
        steps_during_outage = max(e["step"] for e in read_events(run) if e["event"] == "step") - paused_at
    finally:
        moto.resume()
    assert child.wait() == 0, log.read_text()[-3000:]
    assert steps_during_outage >= 3
    events = read_events(run)
    # nothing lost once it is back: the newest checkpoints (and the permanent ones) and the output
    assert _complete_remote_steps(moto, bucket, name) == [4, 8, 11, 12]
    keys = moto.keys(bucket, f"{PREFIX}/{name}/")
    assert f"{PREFIX}/{name}/{name}.safetensors" in keys
    assert not [e for e in events if e["event"] == "upload" and e["status"] in ("failed", "incomplete")]
    uploads = [e["status"] for e in events if e["event"] == "upload"]
    assert "done" in uploads[uploads.index("retrying"):]  # uploads went on after the outage


def test_multipart_upload_and_partial_checkpoints(moto, tmp_path):
    """Big files go up in parts; a checkpoint whose manifest did not arrive is incomplete (never
    listed as a checkpoint) and a complete one verifies against its manifest when downloaded."""
    import os
    from trainer_backend.run.checkpoint_files import write_manifest
    from trainer_backend.remote.s3 import RemoteStore
    bucket = moto.make_bucket("multipart")
    store = RemoteStore(moto.client(), bucket, "p/run/", multipart_mb=5)
    folder = tmp_path / "checkpoints" / "step-00000007"
    folder.mkdir(parents=True)
    (folder / "optimizer.bin").write_bytes(os.urandom(11 * 1024 * 1024))
    (folder / "trainer_state.json").write_text("{}")
    # the manifest is missing: every file goes up, then the manifest upload fails
    with pytest.raises(FileNotFoundError):
        store.upload_checkpoint(folder)
    assert store.checkpoints() == [] and store.incomplete_steps() == [7]
    etag = moto.client().head_object(Bucket=bucket, Key="p/run/checkpoints/step-00000007/optimizer.bin")["ETag"]
    assert etag.strip('"').endswith("-3"), f"not a 3-part multipart upload: {etag}"

    write_manifest(folder, 7, {"loss": 0.5}, "steps")
    done = {"optimizer.bin", "trainer_state.json"}  # a retry sends only what is missing
    assert store.upload_checkpoint(folder, done) == (folder / "manifest.json").stat().st_size
    [remote] = store.checkpoints()
    assert remote.step == 7 and remote.metrics == {"loss": 0.5} and store.incomplete_steps() == []
    local = store.download_checkpoint(remote.key, tmp_path / "restore", "step-00000007")
    assert (local / "optimizer.bin").read_bytes() == (folder / "optimizer.bin").read_bytes()
    store.delete_checkpoint(7)
    assert moto.keys(bucket, "p/run/") == {}
    # a folder output (a full fine-tune's diffusers model) goes up file by file
    model = tmp_path / "model"
    (model / "unet").mkdir(parents=True)
    (model / "unet" / "config.json").write_text("{}")
    (model / "model_index.json").write_text("{}")
    store.put_folder(model, "model")
    assert set(moto.keys(bucket, "p/run/")) == {"p/run/model/model_index.json", "p/run/model/unet/config.json"}


def test_resume_none_and_unreachable_bucket_are_refused(moto, secrets_file, zygote, fast_inputs, tmp_path):
    bucket = moto.make_bucket("refuse")
    moto.client().put_object(Bucket=bucket, Key=f"{PREFIX}/taken/checkpoints/step-00000003/manifest.json",
                             Body=json.dumps({"step": 3, "files": {}}).encode())
    config = write_config(tmp_path / "n.toml", *fast_inputs, tmp_path / "runs", "taken",
                          {"cloud": cloud_section(moto, bucket, secrets_file),
                           "checkpoints": {"resume": "none"}})
    log = tmp_path / "n.log"
    assert zygote.run(config, log, env=env_without_aws()) == exitcodes.BAD_CONFIG
    assert "checkpoints.resume" in log.read_text() and "output.name" in log.read_text()

    # nothing local and the endpoint unreachable: refuse to start over from scratch
    from conftest import free_port
    dead = cloud_section(moto, bucket, secrets_file)
    dead["endpoint_url"] = f"http://127.0.0.1:{free_port()}"
    config = write_config(tmp_path / "d.toml", *fast_inputs, tmp_path / "runs", "dead", {"cloud": dead})
    log = tmp_path / "d.log"
    assert zygote.run(config, log, env=env_without_aws()) == exitcodes.ERROR
    text = log.read_text()
    assert "refusing to start from scratch" in text and "cloud.endpoint_url" in text
    # one line on stderr, the traceback only in train.log (issue 17 item 15)
    assert "Traceback" not in text
    assert "Traceback" in (tmp_path / "runs" / "dead" / "train.log").read_text()
    assert not (tmp_path / "runs" / "dead" / "checkpoints").exists() or not valid_steps(tmp_path / "runs" / "dead")
