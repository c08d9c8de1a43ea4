"""Krea 2 editing on image pairs (families/krea2/references.py, pipeline.py): the control images' latents
ride along as reference tokens after the target's, at rotary time index 1, 2, … and modulated at t = 0,
the prediction is the target's tokens only; a run on a folder of generated pairs (with a caption-only
image beside them) trains, samples its edit prompt with the reference, and writes a LoRA that loads in
Krea2Pipeline and in the edit pipeline and changes what each draws. Accumulation and resume on pairs: the
conformance suite (krea2 trains on pairs there)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file

from conftest import ROOT, make_dataset
from method_runs import train_run
from trainer_backend.families import load_model


@pytest.fixture(scope="module")
def raw(tiny_models):
    model = load_model(str(tiny_models("krea2")))
    return model, model.family.build_pipeline(model)


def _by_hand(transformer, target, refs, hidden, mask, t):
    """The transformer's forward written out from its own modules, with a per-token modulation: the
    text and target tokens at the step's t, the references (after the target, positions (i + 1, h, w))
    at t = 0; the output cut to the target's tokens."""
    b, n_target, _ = target.shape
    grid = int(n_target ** 0.5)
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    cell = torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3).float()
    positions = torch.cat([torch.zeros(hidden.shape[1], 3), cell] + [cell + torch.tensor([i + 1., 0, 0])
                                                                      for i in range(len(refs))])
    temb = transformer.time_embed(t, dtype=torch.float32)
    mod = transformer.time_mod_proj(F.gelu(temb, approximate="tanh"))
    mod0 = transformer.time_mod_proj(F.gelu(transformer.time_embed(torch.zeros_like(t), dtype=torch.float32),
                                            approximate="tanh"))
    n_ref = sum(r.shape[1] for r in refs)
    per_token = torch.cat([mod.expand(b, hidden.shape[1] + n_target, -1), mod0.expand(b, n_ref, -1)], dim=1)
    keys = torch.cat([mask, mask.new_ones(b, n_target + n_ref)], dim=1)[:, None, None, :]
    text = transformer.txt_in(transformer.text_fusion(hidden, attention_mask=mask[:, None, None, :]))
    x = torch.cat([text, transformer.img_in(torch.cat([target, *refs], dim=1))], dim=1)
    rotary = transformer.rotary_emb(positions)
    for block in transformer.transformer_blocks:
        x = block(x, per_token, rotary, keys)
    return transformer.final_layer(x[:, hidden.shape[1]:hidden.shape[1] + n_target], temb)


def test_references_follow_the_target_at_their_own_time_index_modulated_at_t0_and_only_the_target_is_predicted(raw):
    from trainer_backend.families.qwen_image.family import pack, unpack
    from trainer_backend.families.krea2.references import reference_positions
    model, _ = raw
    family = model.family
    g = torch.Generator().manual_seed(5)
    latents, first, second = (torch.randn(2, 4, 8, 8, generator=g) for _ in range(3))
    control = torch.cat([first, second], dim=1)  # two references per sample, along the channels (data/pairs.py)
    timesteps = torch.tensor([700.0, 250.0])
    with torch.no_grad():
        text = family.encode_text(model, family.tokenize(model, ["make it blue", "add a circle"], 75))
        ours = family.predict(model, model.denoiser, latents, timesteps, text, {"control_latents": control},
                              torch.float32)
        expected = _by_hand(model.denoiser, pack(latents), [pack(first), pack(second)], text["hidden"],
                            text["mask"].bool(), timesteps / 1000)
        alone = family.predict(model, model.denoiser, latents, timesteps, text, {}, torch.float32)
        one_ref = family.predict(model, model.denoiser, latents, timesteps, text, {"control_latents": first},
                                 torch.float32)
    assert ours.shape == latents.shape
    torch.testing.assert_close(ours, unpack(expected, 4, 8, 8), rtol=1e-5, atol=1e-5)
    # the references matter, and each one does
    assert (ours - alone).abs().max() > 1e-3 and (ours - one_ref).abs().max() > 1e-3
    # the positions: second reference at t = 2 on its own 2 × 3 grid
    assert reference_positions(2, 2, 3, "cpu")[6:].tolist() == [[2, 0, 0], [2, 0, 1], [2, 0, 2], [2, 1, 0], [2, 1, 1],
                                                                [2, 1, 2]]


def test_the_edit_pipeline_without_an_image_is_krea2pipeline(raw):
    from diffusers import Krea2Pipeline
    model, pipe = raw
    plain = Krea2Pipeline(**pipe.components, text_encoder_select_layers=pipe.config.text_encoder_select_layers)
    call = dict(prompt="a red square", num_inference_steps=2, height=64, width=64, output_type="np")
    a = pipe(**call, generator=torch.Generator().manual_seed(0)).images[0]
    b = plain(**call, generator=torch.Generator().manual_seed(0)).images[0]
    assert np.array_equal(a, b)
    with_reference = pipe(**call, image=Image.new("RGB", (48, 80), (200, 30, 30)),
                          generator=torch.Generator().manual_seed(0)).images[0]
    assert with_reference.shape == a.shape and np.abs(with_reference - a).max() > 1e-3
    # a reference keeps its aspect at the output's area (as many tokens as training gives it), never stretched
    assert pipe.reference_size(Image.new("RGB", (48, 80)), 64, 64) == (80, 48)
    assert pipe.reference_size(Image.new("RGB", (256, 256)), 64, 64) == (64, 64)


def test_references_of_different_sizes_each_keep_their_own_grid():
    from trainer_backend.families.krea2.references import pack_references
    tokens, positions = pack_references([torch.zeros(1, 4, 4, 6), torch.zeros(1, 4, 6, 2)], "cpu", torch.float32)
    assert tokens.shape == (1, 6 + 3, 16)
    assert positions.tolist() == [[1, 0, 0], [1, 0, 1], [1, 0, 2], [1, 1, 0], [1, 1, 1], [1, 1, 2],
                                  [2, 0, 0], [2, 1, 0], [2, 2, 0]]


def test_a_pairs_caption_is_read_after_its_references_as_the_edit_pipeline_reads_it(raw):
    """Training's text for an edit pair (family.tokenize with control pixels, as batches hold them) is
    "Picture 1: <vision tokens>" + caption inside the pipeline's prefix and suffix; each caption of a batch
    encodes as it would alone (right padding, masked), and Krea2EditPipeline encodes a prompt with its
    reference to the same features, so samples see what training saw."""
    from trainer_backend.families.qwen_image.text import to_pil
    model, pipe = raw
    family = model.family
    g = torch.Generator().manual_seed(9)
    pixels = (torch.rand(2, 3, 64, 64, generator=g) * 2 - 1).mul(127.5).round().div(127.5)  # exact as 8-bit PIL
    captions = ["make it blue", "add a small yellow circle in the top left corner"]
    with torch.no_grad():
        inputs = family.tokenize(model, captions, 75, controls=pixels)
        batch = family.encode_text(model, inputs)
        alone = family.encode_text(model, family.tokenize(model, captions[1:], 75, controls=pixels[1:]))
        other = family.encode_text(model, family.tokenize(model, captions[1:], 75, controls=pixels[:1]))
        sampled, sampled_mask = pipe.encode_with_references(captions[:1], to_pil(pixels[:1]))
    text = model.tokenizers[0].decode(inputs[0][0][inputs[1][0].bool()])
    assert "user\nPicture 1: <|vision_start|><|image_pad|>" in text and text.endswith("make it blue<|im_end|>\n"
                                                                                      "<|im_start|>assistant\n")
    assert text.count("<|image_pad|>") == 4  # a 64 px reference: 2 × 2 merged 32-px patches
    n0, n1 = (int(m.sum()) for m in batch["mask"])
    assert batch["mask"][0, :n0].all() and not batch["mask"][0, n0:].any() and n1 > n0
    torch.testing.assert_close(batch["hidden"][1, :n1], alone["hidden"][0, :n1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sampled[0, :n0], batch["hidden"][0, :n0], rtol=1e-5, atol=1e-5)
    assert sampled_mask[0].sum() == n0
    assert (other["hidden"] - alone["hidden"]).abs().max() > 1e-3  # the encoder reads the reference


def _pairs(tmp_path):
    """3 targets, each with a control image (its colours inverted: the "edit" undoes it), and one
    caption-only image beside them."""
    data = make_dataset(tmp_path / "data", n=4, size=64, captions=["invert the colours"] * 3 + ["a plain square"])
    control = tmp_path / "control"
    control.mkdir()
    for i in range(3):
        image = np.asarray(Image.open(data / f"img{i:03d}.png"))
        Image.fromarray(255 - image).save(control / f"img{i:03d}.png")
    return data, control


def test_edit_training_on_pairs_end_to_end(tmp_path, tiny_models, raw):
    folder = tiny_models("krea2")
    data, control = _pairs(tmp_path)
    reference = control / "img000.png"
    common = ["dataset.resolution=64", "schedule.max_steps=4", "optimizer.lr=1e-2", "network.dropout=0"]
    prompts = tmp_path / "prompts.txt"  # the same prompt and seed, with and without the reference
    prompts.write_text(f"invert the colours --control {reference} --s 2\ninvert the colours --s 2\n")
    run, events, _ = train_run(tmp_path, folder, data, "edit", f"dataset.control_path={control}", *common,
                               f"samples.prompt_file={prompts}", "samples.every_n_steps=4")
    assert "1 of 4 images" in (run / "train.log").read_text()  # the caption-only image trained beside the pairs
    (sample,) = [e for e in events if e["event"] == "sample"]
    edited, generated = (np.asarray(Image.open(p), dtype=float) for p in sample["paths"])
    assert np.abs(edited - generated).max() > 2, "the edit sample did not see its reference"
    # the pairs' references entered the loss: the same run without the control folder trains another LoRA
    lora = run / "edit.safetensors"
    plain_run, _, _ = train_run(tmp_path, folder, data, "no-pairs", *common)
    a, b = load_file(str(lora)), load_file(str(plain_run / "no-pairs.safetensors"))
    assert max((a[k] - b[k]).abs().max().item() for k in a) > 1e-4

    model, pipe = raw
    call = dict(prompt="invert the colours", num_inference_steps=2, height=64, width=64, output_type="np")
    image = Image.open(reference)
    before = pipe(**call, generator=torch.Generator().manual_seed(0)).images[0]
    before_edit = pipe(**call, image=image, generator=torch.Generator().manual_seed(0)).images[0]
    from diffusers import Krea2Pipeline
    plain = Krea2Pipeline.from_pretrained(str(folder), local_files_only=True)  # as a diffusers user loads it
    plain.load_lora_weights(str(lora))
    pipe.load_lora_weights(str(lora))
    try:
        after = pipe(**call, generator=torch.Generator().manual_seed(0)).images[0]
        after_edit = pipe(**call, image=image, generator=torch.Generator().manual_seed(0)).images[0]
        loaded = plain(**call, generator=torch.Generator().manual_seed(0)).images[0]
    finally:
        pipe.unload_lora_weights()
    assert np.abs(after - before).max() > 1e-3 and np.abs(after_edit - before_edit).max() > 1e-3
    assert np.abs(loaded - after).max() < 1e-4  # the same LoRA in plain diffusers draws what the edit pipeline draws


def test_the_memory_plan_counts_an_edit_pairs_reference_tokens(tmp_path):
    """Krea 2's table is measured on captions alone; a config naming a control folder plans the pairs'
    reference tokens too (one reference at the target's size): the same run needs more, and says why."""
    from trainer_backend.config import load_config
    from trainer_backend.launch.memory_plan import plan_memory
    (tmp_path / "before").mkdir()
    generate = load_config("presets/krea2-lora-24gb.toml", [])
    edit = load_config("presets/krea2-lora-24gb.toml", [f"dataset.control_path={tmp_path / 'before'}"])
    a, b = plan_memory(generate), plan_memory(edit)
    assert b.phases["forward/backward"] > a.phases["forward/backward"] * 1.3
    assert b.resident == a.resident and any("reference" in n for n in b.notes)
    assert b.verdict(24) == "fits"  # the 24 GB tier trains Krea 2 edits at 1024 px (docs/models.md)
    # Qwen3-VL reads a pair's references: without cached latents (the control's crop changes per step) the
    # pairs' text is encoded every step; a text-to-image run caches its captions
    uncached = ["dataset.cache_latents=false"]
    assert "text encoders" in plan_memory(load_config("presets/krea2-lora-24gb.toml", [
        *uncached, f"dataset.control_path={tmp_path / 'before'}"])).phases
    assert "text encoders" not in plan_memory(load_config("presets/krea2-lora-24gb.toml", uncached)).phases


def test_a_text_encoder_without_its_vision_tower_is_refused_for_pairs(raw):
    import copy
    from trainer_backend.errors import ConfigError
    from trainer_backend.families.krea2.family import vision_tower_loaded
    model, _ = raw
    encoder = copy.deepcopy(model.text_encoders[0])
    vision_tower_loaded(encoder)
    with torch.no_grad():  # what a text-encoder file without visual.* weights loads as (qwen3vl_file.py)
        for name, p in encoder.named_parameters():
            if name.startswith("visual."):
                p.zero_()
    with pytest.raises(ConfigError, match="^dataset.control_path: .*vision tower.*model.text_encoder"):
        vision_tower_loaded(encoder)


@pytest.mark.slow
@pytest.mark.both_cores
def test_two_processes_on_pairs_match_one_process_with_double_batch(tmp_path, tiny_models):
    """The reference hooks sit on the transformer inside DDP: 2 CPU ranks × batch 1 on edit pairs (the text
    read with the references, the reference tokens at t = 0) train the LoRA 1 process × batch 2 trains
    (measured: 3.8e-6 relative). About 1.5 min on 2 cores: slow."""
    from trainer_backend.config import load_config
    from trainer_backend.config.checks import validate_for_run
    from trainer_backend.training.loop import train
    data, control = _pairs(tmp_path)
    common = [f"model.path={tiny_models('krea2')}", f"dataset.path={data}", f"dataset.control_path={control}",
              "dataset.resolution=32", f"output.dir={tmp_path / 'runs'}", "precision.mixed=no", "network.rank=4",
              "network.alpha=4", "network.dropout=0", "optimizer.name=sgd", "optimizer.lr=0.5", "schedule.epochs=2",
              "hardware.cpu=true", "logging.tensorboard=false", "dataset.cache_auto=false"]
    assert train(validate_for_run(load_config(None, [*common, "output.name=one", "schedule.batch_size=2"]))) == 0
    cmd = [sys.executable, "-m", "trainer_backend", "launch"]
    for item in [*common, "output.name=two", "schedule.batch_size=1", "hardware.num_processes=2"]:
        cmd += ["--set", item]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    a = load_file(str(tmp_path / "runs" / "one" / "one.safetensors"))
    b = load_file(str(tmp_path / "runs" / "two" / "two.safetensors"))
    worst = max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)).item() for k in a)
    assert worst <= 1e-5, f"max relative difference {worst:.2e}"
