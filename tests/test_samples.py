"""Sample images during training: prompt options, exactly the configured steps and sizes,
reproducible images, TensorBoard, `control/sample_now`, and no effect on training."""
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.config import ConfigError, load_config
from trainer_backend.diffusion.sampling import SamplePrompt, load_prompts, parse_prompt_line


def test_prompt_line_options():
    d = SamplePrompt(prompt="", width=512, height=512, seed=3, steps=20, cfg_scale=7.0)
    p = parse_prompt_line("a dog, in a hat --n blurry, ugly --w 768 --h 500 --d 42 --s 28 --l 5.5", d)
    assert p == SamplePrompt("a dog, in a hat", "blurry, ugly", 768, 496, 42, 28, 5.5)  # 500 -> multiple of 8
    assert parse_prompt_line("just a prompt", d) == SamplePrompt("just a prompt", "", 512, 512, 3, 20, 7.0)


def test_prompts_defaults_and_errors_name_the_line(tmp_path):
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("# comment\nfrom the file --d 9\n")
    cfg = load_config(None, ['samples.prompts="first\\n\\nsecond --w 64"', f"samples.prompt_file={prompt_file}",
                             "samples.seed=100", "dataset.resolution=256", "samples.steps=5"])
    prompts = load_prompts(cfg)
    assert [(p.prompt, p.seed, p.width, p.height, p.steps) for p in prompts] == [
        ("first", 100, 256, 256, 5), ("second", 101, 64, 256, 5), ("from the file", 9, 256, 256, 5)]
    bad = load_config(None, ['samples.prompts="fine\\nbroken --x 3"'])
    with pytest.raises(ConfigError, match=r"samples.prompts: line 2: unknown option --x"):
        load_prompts(bad)
    with pytest.raises(ConfigError, match=r"samples.prompts: line 1: --w needs a number"):
        load_prompts(load_config(None, ['samples.prompts="a --w wide"']))


def test_samples_at_configured_steps_and_sizes(tmp_path, tiny_models):
    """2 images, batch 1: an epoch is 2 steps. every 3 steps + every epoch + before the first
    step, over 4 steps -> samples at 0, 2 (epoch 1), 3, 4 (epoch 2) and nowhere else."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from trainer_backend.families.sd.loader import build_pipeline, load_model
    model_dir = tiny_models("sd1")
    data = make_dataset(tmp_path / "data", n=2, size=32)
    prompts = "a red square --w 48 --h 32 --s 1 --d 5 --l 4\\nblue --s 1"
    run, events, _ = train_run(tmp_path, model_dir, data, "s", "schedule.max_steps=4", "samples.every_n_steps=3",
                               "samples.every_n_epochs=1", "samples.before_first_step=true",
                               f'samples.prompts="{prompts}"', "logging.tensorboard=true")
    samples = [e for e in events if e["event"] == "sample"]
    assert [e["step"] for e in samples] == [0, 2, 3, 4]
    files = sorted(p.name for p in (run / "samples").iterdir())
    assert files == [f"step-{s:08d}_p{i:02d}.png" for s in (0, 2, 3, 4) for i in (0, 1)]
    assert [e["paths"] for e in samples][1] == [str(run / "samples" / f"step-00000002_p0{i}.png") for i in (0, 1)]
    for s in (0, 2, 3, 4):
        assert Image.open(run / "samples" / f"step-{s:08d}_p00.png").size == (48, 32)
        assert Image.open(run / "samples" / f"step-{s:08d}_p01.png").size == (32, 32)  # dataset.resolution

    # step 0 is the base model (LoRA starts as a no-op): the same prompt and seed reproduce it
    pipe = build_pipeline(load_model(str(model_dir)))
    again = pipe(prompt="a red square", width=48, height=32, num_inference_steps=1, guidance_scale=4,
                 generator=torch.Generator().manual_seed(5)).images[0]
    first = Image.open(run / "samples" / "step-00000000_p00.png")
    diff = torch.tensor(list(first.getdata())) - torch.tensor(list(again.getdata()))
    assert diff.abs().max() <= 1

    tb = EventAccumulator(str(run / "tb"), size_guidance={"images": 0})
    tb.Reload()
    assert [e.step for e in tb.Images("samples/p00")] == [0, 2, 3, 4]


def test_sampling_does_not_change_training(tmp_path, tiny_models):
    """Adapter dropout draws from the global RNG, and sampling runs the model in eval mode: with
    both restored, a run that samples ends with the same weights as one that does not. A
    control/sample_now left over from before the run is stale and cleared, not acted on."""
    data = make_dataset(tmp_path / "data", n=2, size=32)
    common = ["schedule.max_steps=3", "network.dropout=0.5", "optimizer.lr=1e-2"]
    run_a, _, _ = train_run(tmp_path, tiny_models("sd1"), data, "plain", *common)
    (tmp_path / "runs" / "sampled" / "control").mkdir(parents=True)
    (tmp_path / "runs" / "sampled" / "control" / "sample_now").touch()  # left over from an earlier run
    run_b, events, _ = train_run(tmp_path, tiny_models("sd1"), data, "sampled", *common, "samples.every_n_steps=2",
                                 'samples.prompts="a square --s 1"')
    assert [e["step"] for e in events if e["event"] == "sample"] == [2]
    assert not (run_b / "control" / "sample_now").exists()
    a, b = load_file(str(run_a / "plain.safetensors")), load_file(str(run_b / "sampled.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_sample_now_during_a_run(tmp_path, tiny_models):
    """The GUI's "Sample now" writes control/sample_now; the run samples after its next step."""
    import threading
    import time
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run_dir = tmp_path / "runs" / "asked"
    done = threading.Event()

    def ask_after_first_step():
        events = run_dir / "events.jsonl"
        while not done.is_set():
            if events.exists() and '"event": "step"' in events.read_text():
                (run_dir / "control" / "sample_now").touch()
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=ask_after_first_step, daemon=True)
    watcher.start()
    try:
        _, events, _ = train_run(tmp_path, tiny_models("sd1"), data, "asked", "schedule.max_steps=12",
                                 'samples.prompts="a square --s 1"')
    finally:
        done.set()
    sampled = [e["step"] for e in events if e["event"] == "sample"]
    assert len(sampled) == 1 and 2 <= sampled[0] <= 12, sampled
    assert not (run_dir / "control" / "sample_now").exists()
