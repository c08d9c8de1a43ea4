"""model.quantize / model.quantize_text_encoders (a quantized frozen base, QLoRA-style) and the 8-bit /
paged optimizers: a quantized-base LoRA trains with the loss of the unquantized run (within a stated
tolerance), writes a file of the very same format that loads in diffusers and changes the output; the
bitsandbytes optimizers take 8-bit steps and resume; refused combinations name the key."""
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import last_checkpoint, train_run, unet_probe
from trainer_backend.config import ConfigError, load_config, rules
from trainer_backend.families.sd.loader import build_pipeline, load_model
from trainer_backend.methods.variants import load_adapter_file

# Per-step loss of a quantized-base run vs the unquantized run with the same seed: within 2% (relative).
# Seen here: int8 ~1e-4, float8 and nf4 ~1e-3 relative on the tiny models.
LOSS_RTOL = 0.02
# Metadata that differs between two runs of the same config (times, the run's own identity).
VOLATILE = {"ss_training_started_at", "ss_session_id", "ss_training_finished_at", "modelspec.date"}
STEPS = ["schedule.max_steps=3", "optimizer.lr=1e-2"]

CASES = {  # name: (arch, model.quantize, model.quantize_text_encoders, network.train_text_encoder)
    "sd1-int8": ("sd1", "int8", "none", False),
    "sd1-float8": ("sd1", "float8", "none", False),
    "sd1-nf4-te-nf4": ("sd1", "nf4", "nf4", True),
    "sdxl-int8-te-float8": ("sdxl", "int8", "float8", True),   # two text encoders (marked slow: ~2× sd1's time)
}
SLOW = {"sdxl-int8-te-float8"}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("qdata"), n=2, size=32)


@pytest.fixture(scope="module")
def baselines(tmp_path_factory, tiny_models, data):
    """(arch, train_text_encoder) -> the unquantized run (run dir, losses), trained once."""
    done = {}

    def get(arch: str, train_te: bool):
        if (arch, train_te) not in done:
            run, events, _ = train_run(tmp_path_factory.mktemp(f"base-{arch}"), tiny_models(arch), data, "q",
                                       *STEPS, f"network.train_text_encoder={str(train_te).lower()}")
            done[arch, train_te] = run, losses(events)
        return done[arch, train_te]
    return get


def losses(events) -> list[float]:
    return [e["loss"] for e in events if e["event"] == "step"]


def file_format(path):
    with safe_open(str(path), framework="pt") as f:
        meta = {k: v for k, v in (f.metadata() or {}).items() if k not in VOLATILE}
        return {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}, meta


def text_probe(pipe) -> torch.Tensor:
    ids = torch.arange(1, 9).unsqueeze(0)
    with torch.no_grad():
        return torch.cat([te(ids)[0].flatten() for te in (pipe.text_encoder, getattr(pipe, "text_encoder_2", None))
                          if te is not None])


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES])
def test_quantized_base_lora_tracks_the_unquantized_run_and_saves_the_same_file(tmp_path, tiny_models, data,
                                                                              baselines, case):
    arch, quant, quant_te, train_te = CASES[case]
    model_dir = tiny_models(arch)
    run, events, _ = train_run(tmp_path, model_dir, data, "q", *STEPS, f"model.quantize={quant}",
                               f"model.quantize_text_encoders={quant_te}",
                               f"network.train_text_encoder={str(train_te).lower()}")
    base_run, base_losses = baselines(arch, train_te)
    log = (run / "train.log").read_text()
    assert f"model.quantize = {quant}:" in log and "linear layers of the UNet2DConditionModel quantized" in log
    if quant_te != "none":
        assert f"model.quantize_text_encoders = {quant_te}:" in log
    got = losses(events)
    assert len(got) == len(base_losses) == 3
    for q, ref in zip(got, base_losses):
        assert abs(q - ref) <= LOSS_RTOL * abs(ref), (got, base_losses)

    # the same file as without quantization: keys, shapes, dtypes and metadata
    output, base_output = run / "q.safetensors", base_run / "q.safetensors"
    assert file_format(output) == file_format(base_output)

    # it loads onto a fresh (unquantized) diffusers pipeline and changes what the model computes
    pipe = build_pipeline(load_model(str(model_dir)))
    before_unet, before_text = unet_probe(pipe.unet), text_probe(pipe)
    load_adapter_file(pipe, output)
    assert (unet_probe(pipe.unet) - before_unet).abs().max() > 1e-4
    if train_te:
        assert (text_probe(pipe) - before_text).abs().max() > 1e-5


def test_full_fine_tune_with_quantized_frozen_text_encoder_saves_the_original_text_encoder(tmp_path, tiny_models,
                                                                                          data):
    """A full fine-tune of the UNet may quantize the frozen text encoder; the saved model carries the text
    encoder's original weights, not the quantized ones."""
    model_dir = tiny_models("sd1")
    run, events, _ = train_run(tmp_path, model_dir, data, "full", "network.type=full", "schedule.max_steps=2",
                               "optimizer.lr=1e-3", "model.quantize_text_encoders=int8",
                               "network.save_precision=fp32")
    assert "model.quantize_text_encoders = int8:" in (run / "train.log").read_text()
    saved = load_model(str(run / "full-diffusers"))
    original = load_model(str(model_dir))
    te, te0 = saved.text_encoders[0].state_dict(), original.text_encoders[0].state_dict()
    assert te.keys() == te0.keys()
    assert all(torch.equal(te[k], te0[k]) for k in te0)
    assert (unet_probe(saved.unet) - unet_probe(original.unet)).abs().max() > 1e-5  # the UNet did train


@pytest.mark.parametrize("optimizer, quant", [("adamw8bit", "none"), ("paged_adamw8bit", "nf4")])
def test_8bit_optimizers_step_with_8bit_states_and_resume(tmp_path, tiny_models, data, optimizer, quant):
    """Rank 64 makes some adapter matrices 4096 values large: bitsandbytes keeps 8-bit states for those."""
    model_dir = tiny_models("sd1")
    opts = [f"optimizer.name={optimizer}", f"model.quantize={quant}", "network.rank=64", "network.alpha=64",
            "optimizer.lr=1e-3", "checkpoints.every_n_steps=2"]
    straight, events, _ = train_run(tmp_path / "a", model_dir, data, "o", "schedule.max_steps=4", *opts)
    assert len(losses(events)) == 4 and all(map(lambda x: x == x, losses(events)))
    state = torch.load(last_checkpoint(straight) / "optimizer.bin", weights_only=False)["state"]
    packed = [s.get("__bnb_optimizer_quant_state__", s) for s in state.values()]   # bitsandbytes packs its states
    dtypes = {v.dtype for s in packed for k, v in s.items() if k.startswith("state")}
    assert torch.uint8 in dtypes, dtypes   # 8-bit optimizer states, not a silent fp32 fallback

    train_run(tmp_path / "b", model_dir, data, "o", "schedule.max_steps=2", *opts)
    resumed, events, _ = train_run(tmp_path / "b", model_dir, data, "o", "schedule.max_steps=4", *opts)
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2, 3, 4]   # both runs: continued at 3
    a, b = load_file(str(straight / "o.safetensors")), load_file(str(resumed / "o.safetensors"))
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6


@pytest.mark.parametrize("overrides, key, words", [
    (["network.type=full", "model.quantize=int8"], "model.quantize", "network.type = full"),
    (["network.type=full", "network.train_text_encoder=true", "model.quantize_text_encoders=nf4"],
     "model.quantize_text_encoders", "network.type = full"),
    (["network.type=vae", "model.quantize=float8"], "model.quantize", "VAE"),
    (["network.type=loha", "model.quantize=nf4"], "model.quantize", "LoRA/DoRA adapters only"),
    (["network.type=lokr", "network.train_text_encoder=true", "model.quantize_text_encoders=nf4"],
     "model.quantize_text_encoders", "LoRA/DoRA adapters only"),
    (["hardware.strategy=fsdp", "model.quantize=int8"], "model.quantize", "hardware.strategy"),
    (["hardware.strategy=deepspeed", "hardware.deepspeed_offload_optimizer=true",
      "optimizer.name=paged_adamw8bit"], "optimizer.name", "paged_adamw8bit"),
])
def test_refused_combinations_name_the_key(overrides, key, words):
    found = [p for p in rules.problems(load_config(None, overrides)) if p.key == key]
    assert found and words in found[0].message, rules.problems(load_config(None, overrides))
    with pytest.raises(ConfigError, match="^" + key.replace(".", r"\.")):
        rules.check(load_config(None, overrides), "quantize" if key.startswith("model.") else "hardware")


def test_allowed_combinations_pass():
    for overrides in (["network.type=loha", "model.quantize=int8", "model.quantize_text_encoders=float8"],
                      ["network.type=full", "model.quantize_text_encoders=nf4"],   # frozen text encoder
                      ["network.type=lokr", "model.quantize_text_encoders=nf4"],   # TE has no adapters
                      ["model.quantize=nf4", "network.dora=true", "optimizer.name=paged_adamw8bit"],
                      # quantized weights move whole (tests/test_block_swap_quantized.py)
                      ["memory.block_swap=2", "model.quantize=int8", "memory.offload_encoders=true",
                       "model.quantize_text_encoders=nf4"]):
        assert [p for p in rules.problems(load_config(None, overrides)) if p.key.startswith("model.")] == []


@pytest.mark.both_cores
def test_two_ddp_processes_with_a_quantized_base_match_one_process(tmp_path, tiny_models):
    """Two real CPU ranks (gloo) × batch 1 equal one process × batch 2 with the UNet int8 and the text
    encoder nf4, adapters on both: DDP leaves the frozen quantized weights alone and still averages the
    adapters' gradients (SGD, no dropout: see tests/test_distributed.py for why)."""
    import subprocess
    import sys
    from conftest import ROOT
    from trainer_backend.config.checks import validate_for_run
    from trainer_backend.training.loop import train
    data = make_dataset(tmp_path / "data", n=4, size=32)
    common = [f"model.path={tiny_models('sd1')}", f"dataset.path={data}", "dataset.resolution=32",
              f"output.dir={tmp_path / 'runs'}", "precision.mixed=no", "network.rank=4", "network.alpha=4",
              "network.dropout=0", "network.train_text_encoder=true", "optimizer.name=sgd", "optimizer.lr=0.5",
              "schedule.epochs=1", "hardware.cpu=true", "logging.tensorboard=false", "model.quantize=int8",
              "model.quantize_text_encoders=nf4"]
    assert train(validate_for_run(load_config(None, [*common, "output.name=one", "schedule.batch_size=2"]))) == 0
    cmd = [sys.executable, "-m", "trainer_backend", "launch"]
    for item in [*common, "output.name=two", "schedule.batch_size=1", "hardware.num_processes=2"]:
        cmd += ["--set", item]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    a = load_file(str(tmp_path / "runs" / "one" / "one.safetensors"))
    b = load_file(str(tmp_path / "runs" / "two" / "two.safetensors"))
    assert a.keys() == b.keys() and any(k.startswith("lora_te_") for k in a)
    worst = max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)).item()
                for k in a if not k.endswith(".alpha"))
    assert worst <= 1e-5, f"max relative difference {worst:.2e}"


def test_kohya_fp8_base_and_paged_adamw8bit_import():
    """kohya_ss presets with fp8_base and PagedAdamW8bit become model.quantize = float8 and paged_adamw8bit."""
    from gui.kohya_import import import_kohya
    result = import_kohya({"LoRA_type": "Standard", "fp8_base": True, "optimizer": "PagedAdamW8bit"})
    cfg = result.config()
    assert (cfg.model.quantize, cfg.optimizer.name) == ("float8", "paged_adamw8bit")
    assert rules.problems(cfg, "quantize") == []
    assert import_kohya({"LoRA_type": "Standard", "fp8_base": False}).config().model.quantize == "none"


@pytest.mark.parametrize("kind, most", [("int8", 0.26), ("float8", 0.26), ("nf4", 0.15)])
def test_quantized_layers_are_smaller_and_kept_layers_are_not(kind, most):
    """The bytes the bench reports are the quantized tensors' real bytes (int8/float8: 1 byte per weight
    plus a scale per row, nf4: half a byte plus an absmax per 64), layers named to keep stay as they were,
    and the quantized layers compute what the fp32 ones did up to their rounding."""
    from trainer_backend.compute.quantize import quantize_module, quantized_kind, weight_bytes
    torch.manual_seed(0)
    net = torch.nn.Sequential()
    net.add_module("proj_in", torch.nn.Linear(256, 256))
    net.add_module("time_embedding", torch.nn.Linear(256, 256))
    x = torch.randn(4, 256)
    ref, fp32 = net(x).detach(), weight_bytes(net.proj_in)
    kept = net.time_embedding.weight.detach().clone()
    assert quantize_module(net, kind, device="cpu", compute_dtype=torch.float32, keep=("time_embedding",)) == 1
    assert quantized_kind(net) == kind
    assert weight_bytes(net.proj_in) <= most * fp32
    assert type(net.time_embedding) is torch.nn.Linear and torch.equal(net.time_embedding.weight, kept)
    with torch.no_grad():
        err = (net(x) - ref).norm() / ref.norm()
    assert 0 < err < 0.15, err
