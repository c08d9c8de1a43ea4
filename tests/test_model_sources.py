"""Hub model ids: parsing (property tests), the family's choice of files, and downloads from a real
loopback server speaking the hub's protocol (tests/hub_server.py): the tiny model fetched once and then
used offline, gated repos, 404, a stalled server, a truncated file, a stopped download resumed."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from hub_server import HubServer, point_client_at
from trainer_backend.errors import ConfigError
from trainer_backend.families.hub_files import pipeline_files, plain_files, tokenizer_files
from trainer_backend.model_sources import HubSpec, hub_spec, parse_hub_spec, resolve_model
from trainer_backend.model_sources.progress import Meter, status_line, DownloadStatus

part = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_-]{0,10}[A-Za-z0-9])?", fullmatch=True)
revision = st.one_of(st.just("main"), st.from_regex(r"[0-9a-f]{40}", fullmatch=True),
                     st.from_regex(r"v[0-9]\.[0-9]", fullmatch=True))


@given(part, part, revision, st.sampled_from(["", "model.safetensors", "sub/ae.sft"]))
def test_a_hub_spec_reads_back_from_its_text(org, name, rev, filename):
    spec = HubSpec(f"{org}/{name}", rev, filename)
    assert parse_hub_spec(str(spec)) == spec


@given(st.sampled_from(["/abs/", "./", "../", "~/", "C:\\", "builtin:", "s3://"]), part, part)
def test_local_looking_paths_are_never_hub_ids(prefix, a, b):
    assert parse_hub_spec(f"{prefix}{a}/{b}") is None


def test_what_is_and_is_not_a_hub_id(tmp_path, monkeypatch):
    assert parse_hub_spec("stabilityai/stable-diffusion-xl-base-1.0") == HubSpec(
        "stabilityai/stable-diffusion-xl-base-1.0")
    assert parse_hub_spec("org/name@v1.0") == HubSpec("org/name", "v1.0")
    assert parse_hub_spec("Comfy-Org/flux1/split_files/ae.safetensors") == HubSpec(
        "Comfy-Org/flux1", "main", "split_files/ae.safetensors")
    for local in ("models/sdxl.safetensors", "model", "org/name/folder", "org/--x", "org/a..b", ""):
        assert parse_hub_spec(local) is None, local
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert hub_spec("org/name") is None  # an existing local folder wins


def test_a_pipeline_repo_gets_one_weight_copy_per_component():
    files = ["model_index.json", "README.md", "v1-5-pruned.safetensors", "v1-5-pruned.ckpt",
             "unet/config.json", "unet/diffusion_pytorch_model.safetensors",
             "unet/diffusion_pytorch_model.fp16.safetensors", "unet/diffusion_pytorch_model.bin",
             "text_encoder/config.json", "text_encoder/model.fp16.safetensors", "text_encoder/flax_model.msgpack",
             "tokenizer/vocab.json", "tokenizer/merges.txt", "safety_checker/model.safetensors",
             "vae/diffusion_pytorch_model.safetensors", "vae/config.json", "onnx/unet/model.onnx"]
    index = {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
             "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
             "vae": ["diffusers", "AutoencoderKL"], "safety_checker": [None, None]}
    assert pipeline_files(files, index) == [
        "model_index.json", "text_encoder/config.json", "text_encoder/model.fp16.safetensors",
        "tokenizer/merges.txt", "tokenizer/vocab.json", "unet/config.json",
        "unet/diffusion_pytorch_model.safetensors", "vae/config.json", "vae/diffusion_pytorch_model.safetensors"]
    assert plain_files(["ae.safetensors", "ae.fp16.safetensors", "sd_xl_base_1.0.safetensors", "a.png"]) == [
        "ae.safetensors", "sd_xl_base_1.0.safetensors"]
    assert tokenizer_files(files) == ["model_index.json", "text_encoder/config.json", "tokenizer/merges.txt",
                                      "tokenizer/vocab.json", "unet/config.json", "vae/config.json"]


def test_speed_and_eta_come_from_the_bytes_over_time():
    meter = Meter(total=1000)
    for t in range(5):
        meter.add(100, float(t))
    assert meter.speed() == pytest.approx(100.0) and meter.eta_s() == pytest.approx(5.0)
    line = status_line(DownloadStatus("org/m", "downloading", "unet/w.safetensors", 500, 1000, 0, 0, 1, 3,
                                      100.0, 5.0))
    assert "500 B / 1.0 KB" in line and "ETA 5 s" in line and "unet/w.safetensors, 2/3" in line


# ---- against the loopback hub
WEIGHT = "unet/diffusion_pytorch_model.safetensors"


@pytest.fixture
def hub(tmp_path, monkeypatch, tiny_models):
    """The tiny SD1 model as `org/tiny-sd1` (plus copies a load never reads), a gated copy, and this
    process pointed at the server with an empty cache."""
    server = HubServer().start()
    repo = server.add_folder("org/tiny-sd1", tiny_models("sd1"))
    repo.files.update({"unet/diffusion_pytorch_model.fp16.safetensors": b"half" * 1000,
                       "v1-5-pruned-emaonly.safetensors": b"single file" * 1000, "README.md": b"# tiny"})
    server.add_folder("org/gated-sd1", tiny_models("sd1"), token="hf_right_token")
    point_client_at(monkeypatch, server, tmp_path / "hf", download_timeout=0.3, chunk_size=16 * 1024)
    yield server
    server.stop()


def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_a_hub_model_downloads_once_then_works_offline(hub, tiny_models, tmp_path, monkeypatch):
    seen = []
    folder = resolve_model("org/tiny-sd1", progress=seen.append)
    assert folder.is_relative_to(tmp_path / "hf" / "hub")  # the standard cache under HF_HOME
    source = tiny_models("sd1")
    for f in source.rglob("*"):
        if f.is_file():
            assert _sha(folder / f.relative_to(source)) == _sha(f)
    assert not (folder / "unet/diffusion_pytorch_model.fp16.safetensors").exists()
    assert not (folder / "v1-5-pruned-emaonly.safetensors").exists() and not (folder / "README.md").exists()
    last = seen[-1]
    assert last.status == "done" and last.bytes == last.total > 0 and last.files_total >= 5
    assert any(s.file == WEIGHT and s.file_bytes == s.file_total for s in seen)

    before = len(hub.requests)
    assert resolve_model("org/tiny-sd1") == folder and len(hub.requests) == before  # no network
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("org/tiny-sd1") == folder
    with pytest.raises(ConfigError, match=r"^model.path: org/gated-sd1 is not \(completely\) in the Hugging Face "
                                          r"cache and downloads are off"):
        resolve_model("org/gated-sd1")


def test_gated_repos_name_the_repo_the_licence_and_the_token(hub, caplog):
    with pytest.raises(ConfigError) as e:
        resolve_model("org/gated-sd1")
    message = str(e.value)
    assert message.startswith("model.path: org/gated-sd1 is a gated or private repo") and "HTTP 401" in message
    assert f"{hub.url}/org/gated-sd1" in message and "licence" in message and "HF_TOKEN" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match="refused the token .HTTP 403"):
        resolve_model("org/gated-sd1", token="hf_wrong_token")
    caplog.set_level("DEBUG")
    folder = resolve_model("org/gated-sd1", token="hf_right_token")
    assert (folder / WEIGHT).is_file() and hub.file_requests(WEIGHT)[-1].authorized  # sent as a bearer token
    assert "hf_right_token" not in caplog.text


def test_unknown_repos_files_and_revisions_get_one_line(hub):
    with pytest.raises(ConfigError, match=r"^model.vae: org/nothing-here is neither a local folder or file nor a "
                                          r"repo on the hub .*HTTP 404"):
        resolve_model("org/nothing-here", key="model.vae")
    with pytest.raises(ConfigError, match=r"org/tiny-sd1 has no file 'missing.safetensors'"):
        resolve_model("org/tiny-sd1/missing.safetensors")
    with pytest.raises(ConfigError, match=r"org/tiny-sd1 has no revision 'v9'"):
        resolve_model("org/tiny-sd1@v9")


def test_a_stalled_download_says_so_and_resumes_where_it_stopped(hub):
    hub.faults.stall_after[WEIGHT] = 12 * 16384  # whole chunks of the client's (point_client_at's chunk_size)
    with pytest.raises(ConfigError, match=r"^model.path: the hub .* stopped answering while downloading "
                                          r"org/tiny-sd1/unet/diffusion_pytorch_model.safetensors"):
        resolve_model("org/tiny-sd1")
    hub.faults.stall_after.clear()
    hub.stopping.set()  # release the stalled handlers
    seen = []
    folder = resolve_model("org/tiny-sd1", progress=seen.append)
    assert seen[0].status == "planned" and seen[0].cached_bytes > 0  # the files before the weight stay fetched
    assert seen[-1].status == "done" and seen[-1].bytes == seen[-1].total
    resumed = [r.range for r in hub.file_requests(WEIGHT)][-1]
    assert resumed == f"bytes={12 * 16384}-"  # the second run asked only for the rest
    assert _sha(folder / WEIGHT) == hashlib.sha256(hub.repos["org/tiny-sd1"].files[WEIGHT]).hexdigest()


def test_a_truncated_file_is_an_error_and_a_retry_fetches_it(hub):
    hub.faults.truncate[WEIGHT] = 1000
    with pytest.raises(ConfigError, match=r"unet/diffusion_pytorch_model.safetensors arrived truncated"):
        resolve_model("org/tiny-sd1")
    hub.faults.truncate.clear()
    folder = resolve_model("org/tiny-sd1")
    assert _sha(folder / WEIGHT) == hashlib.sha256(hub.repos["org/tiny-sd1"].files[WEIGHT]).hexdigest()


def test_only_the_named_file_or_patterns_are_fetched(hub):
    path = resolve_model("org/tiny-sd1/v1-5-pruned-emaonly.safetensors", key="model.path")
    assert path.name == "v1-5-pruned-emaonly.safetensors" and path.read_bytes() == b"single file" * 1000
    folder = resolve_model("org/tiny-sd1", allow_patterns=["tokenizer/*"])
    assert sorted(p.name for p in (folder / "tokenizer").iterdir())
    assert not (folder / WEIGHT).exists()


def test_the_download_command_plans_and_fails_in_one_line(hub, capsys, monkeypatch):
    from trainer_backend.__main__ import main
    assert main(["download", "org/gated-sd1", "--plan"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: repo: org/gated-sd1 is a gated or private repo"), err
    monkeypatch.setenv("HF_TOKEN", "hf_right_token")
    assert main(["download", "org/gated-sd1", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "org/gated-sd1: download" in out and "(sd1 files only" in out and "free space in" in out
    assert WEIGHT in out and "hf_right_token" not in out
    assert main(["download", "org/gated-sd1"]) == 0
    assert (Path(capsys.readouterr().out.strip()) / WEIGHT).is_file()


def test_the_run_page_shows_a_download_before_the_first_step():
    from gui.run_monitor import progress_html, progress_numbers
    from gui.run_state import RunStatus, fold_events
    events = [{"event": "download", "time": 1.0, **DownloadStatus(
        "org/big", "downloading", "unet/w.safetensors", 2_000_000_000, 5_000_000_000, 0, 0, 2, 7, 48e6, 62.0).to_dict()}]
    numbers = progress_numbers(fold_events(events), alive=True, started=0.0, now=2.0)
    page = progress_html(RunStatus("running", "running", True, False), numbers)
    assert "downloading <b>org/big</b>: 2.0 GB / 5.0 GB" in page and "48.0 MB/s" in page and "ETA 1:02" in page
    assert "unet/w.safetensors (3/7)" in page and 'style="width:40.0%"' in page
    done = events + [{"event": "step", "time": 3.0, "step": 1, "total_steps": 10}]
    assert "downloading" not in progress_html(RunStatus("running", "running", True, False),
                                               progress_numbers(fold_events(done), alive=True, started=0.0))


def test_network_down_disk_full_and_offline_checks_name_the_field(hub, tmp_path, monkeypatch):
    from huggingface_hub import constants
    from trainer_backend.config import TrainConfig
    from trainer_backend.config.checks import run_problems
    from trainer_backend.model_sources.hub import DownloadPlan, RepoFile, check_space
    closed = HubServer()  # a port nothing listens on once it is closed: the network is down
    closed._server.server_close()
    monkeypatch.setenv("HF_ENDPOINT", closed.url)
    monkeypatch.setattr(constants, "ENDPOINT", closed.url)
    with pytest.raises(ConfigError, match=r"^model.path: cannot reach the hub .* to download org/tiny-sd1: network down"):
        resolve_model("org/tiny-sd1")

    plan = DownloadPlan(HubSpec("org/big"), "0" * 40, [RepoFile("a.safetensors", 5_000_000_000, False),
                                                       RepoFile("b.json", 10, True)], tmp_path, 3_000_000_000)
    with pytest.raises(ConfigError, match=r"^model.path: org/big needs 5.0 GB of downloads but .* has 3.0 GB free"):
        check_space(plan, "model.path")
    check_space(DownloadPlan(HubSpec("org/big"), "0" * 40, plan.files[:1], tmp_path, 6_000_000_000), "model.path")

    cfg = TrainConfig()
    cfg.model.path, cfg.dataset.path = "org/not-cached", str(tmp_path)
    assert not [p for p in run_problems(cfg) if p.key == "model.path"]  # online: downloaded when the run starts
    cfg.model.hub_download = False
    problem = next(p for p in run_problems(cfg) if p.key == "model.path")
    assert "org/not-cached is not (completely) in the Hugging Face cache and downloads are off" in str(problem)


def test_the_studio_plan_shows_the_download_size_and_free_space(hub, tmp_path):
    import time
    from gui import hub_plan
    from trainer_backend.config import TrainConfig
    cfg = TrainConfig()
    cfg.model.path = "org/tiny-sd1"
    first = hub_plan.download_lines(cfg)
    assert first == ["model.path: org/tiny-sd1: asking the hub for the download size and checking the free space…"]
    deadline = time.monotonic() + 180
    while "asking" in (lines := hub_plan.download_lines(cfg))[0]:  # the live plan never waits on the network
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert lines[0].startswith("model.path: org/tiny-sd1: download 4.9 MB in ") and "free space in" in lines[0]
    assert "(sd1 files only; 3 other files of the repo skipped)" in lines[0]  # fp16 copy, single file, README
    from gui.dataset_view import memory_only_markdown  # the Training page's plan without a scannable dataset
    assert f"#### Downloads (Hugging Face hub)\n\n{lines[0]}  " in memory_only_markdown(cfg)
    cfg.model.path = str(tmp_path)  # a local folder: no line
    assert hub_plan.download_lines(cfg) == []


def test_a_config_gets_its_hub_ids_with_the_token_from_its_secrets(hub, tmp_path, monkeypatch):
    from trainer_backend.config import TrainConfig
    from trainer_backend.model_sources import resolve_config_models
    monkeypatch.delenv("HF_TOKEN", raising=False)
    secrets = tmp_path / "secrets.env"
    secrets.write_text("HF_TOKEN=hf_right_token\n")
    secrets.chmod(0o600)
    cfg = TrainConfig()
    cfg.model.path, cfg.model.tokenizer, cfg.cloud.secrets_file = "org/gated-sd1", "org/tiny-sd1", str(secrets)
    events = []
    resolve_config_models(cfg, emit=lambda kind, **fields: events.append((str(kind), fields)), show=False)
    assert (Path(cfg.model.path) / WEIGHT).is_file()
    tokenizer = Path(cfg.model.tokenizer)  # model.tokenizer: tokenizer files only, no weights
    assert (tokenizer / "tokenizer" / "vocab.json").is_file() and not (tokenizer / WEIGHT).exists()
    assert {kind for kind, _ in events} == {"download"} and "hf_right_token" not in json.dumps(events)
    from gui.run_control import _check_secret_names
    from gui.secrets_panel import secret_names
    assert ("model.hub_token_name", "HF_TOKEN") in secret_names(cfg)  # listed in the studio's Secrets panel
    _check_secret_names(cfg, {"HF_TOKEN": "hf_typed"})  # and passed to the trainer when typed there


def test_the_plan_lines_say_what_a_run_will_download(hub, monkeypatch):
    from trainer_backend.config import TrainConfig
    from trainer_backend.model_sources import plan_lines
    cfg = TrainConfig()
    cfg.model.path, cfg.model.vae = "org/tiny-sd1", "org/tiny-sd1/v1-5-pruned-emaonly.safetensors"
    before = plan_lines(cfg)
    assert before[0].startswith("model.path: org/tiny-sd1: download 4.9 MB in ") and "free space in" in before[0]
    assert before[1].startswith("model.vae: org/tiny-sd1/v1-5-pruned-emaonly.safetensors: download 11.0 KB in 1 files")
    resolve_model("org/tiny-sd1")
    assert plan_lines(cfg)[0].startswith("model.path: org/tiny-sd1: in the Hugging Face cache")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "downloads are off" in plan_lines(cfg)[1]
