"""A captioner named by its hub id: downloaded through model_sources from a loopback server that
speaks the hub's protocol (tests/hub_server.py), only the files of its kind, then captioning; a second
job reads the cache without the network."""
import json

from PIL import Image

from hub_server import HubServer, point_client_at
from trainer_backend.captioners import CaptionOptions, build_tiny_captioner, run_caption_job


def test_a_hub_captioner_is_downloaded_once_and_captions(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(2):
        Image.new("RGB", (32, 32), (90 * i, 40, 200)).save(data / f"img{i}.png")
    tagger = build_tiny_captioner("wd14", tmp_path / "wd14")
    (tagger / "model.safetensors").write_bytes(b"\0" * 64)   # a repo's timm copy: not needed, not fetched
    with HubServer() as hub:
        hub.add_folder("SmilingWolf/tiny-tagger", tagger)
        point_client_at(monkeypatch, hub, tmp_path / "hf")
        options = CaptionOptions(dataset=str(data), model="SmilingWolf/tiny-tagger", job_dir=str(tmp_path / "job"))
        assert run_caption_job(options) == 0
        assert all((data / f"img{i}.txt").read_text() for i in range(2))
        fetched = {r.path.rsplit("/", 1)[-1] for r in hub.requests if r.method == "GET" and "/resolve/" in r.path}
        assert {"model.onnx", "selected_tags.csv"} <= fetched and "model.safetensors" not in fetched
        served = len(hub.requests)
        downloads = [json.loads(line) for line in (tmp_path / "job" / "events.jsonl").read_text().splitlines()
                     if json.loads(line)["event"] == "download"]
        assert downloads and downloads[-1]["status"] == "done"       # the page sees the download's progress
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # the server is gone: the cache answers
    again = CaptionOptions(dataset=str(data), model="SmilingWolf/tiny-tagger", job_dir=str(tmp_path / "job2"),
                           existing="overwrite")
    assert run_caption_job(again) == 0 and served > 0


def test_a_gated_captioner_needs_the_token_the_job_names(tmp_path, monkeypatch):
    from trainer_backend.errors import ConfigError
    import pytest
    data = tmp_path / "data"
    data.mkdir()
    Image.new("RGB", (32, 32), (200, 40, 90)).save(data / "img0.png")
    tagger = build_tiny_captioner("wd14", tmp_path / "wd14")
    with HubServer() as hub:
        hub.add_folder("org/gated-tagger", tagger, token="hf_caption_secret")
        point_client_at(monkeypatch, hub, tmp_path / "hf")
        monkeypatch.delenv("HF_TOKEN", raising=False)
        options = dict(dataset=str(data), model="org/gated-tagger", job_dir=str(tmp_path / "job"))
        with pytest.raises(ConfigError, match=r"^--model: .*org/gated-tagger"):
            run_caption_job(CaptionOptions(**options))
        assert not (data / "img0.txt").exists()
        monkeypatch.setenv("MY_HUB_TOKEN", "hf_caption_secret")
        assert run_caption_job(CaptionOptions(**options, hub_token_name="MY_HUB_TOKEN")) == 0
    assert (data / "img0.txt").read_text()
    assert "hf_caption_secret" not in (tmp_path / "job" / "job.json").read_text()
    assert "hf_caption_secret" not in (tmp_path / "job" / "train.log").read_text()
