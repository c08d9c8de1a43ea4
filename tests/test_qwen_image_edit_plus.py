"""Qwen-Image-Edit-2509 / 2511 (QwenImageEditPlusPipeline): several reference images per training image.

Data: references named `<stem>_0, <stem>_1, …` in the control folder stay aligned with their training
image, in order, through bucketing, random crop, flip and the latent cache (each reference is a known
function of its image: the first inverted, the second with its colour channels reversed, so a swap, a
shift or a missed flip shows); a missing reference is one warning and the image is skipped. Model: the
text conditioning and the forward call with two references are the pipeline's own (2509 and 2511's
zero_cond_t transformer), a LoRA file loads in QwenImageEditPlusPipeline and gives the trained model's
transformer output, and a two-reference run trains."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import train_run
from test_data_helpers import config
import test_qwen_image
from test_qwen_image import _pipe, _randomized_adapters
from trainer_backend.config import ConfigError, from_dict
from trainer_backend.data import TrainDataset, collate, scan_dataset

ONE_STEP = 1.0 / 127.5 + 1e-6   # one 8-bit level in [-1, 1]
PLUS = ["qwen_image_edit_plus", "qwen_image_edit_plus-2511"]


def reference_pair(images: Path, controls: Path, name: str, width: int, height: int, seed: int) -> None:
    """A noise image; its references `<name>_0.bmp` (inverted) and `<name>_1.png` (channels reversed)."""
    arr = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    images.mkdir(parents=True, exist_ok=True)
    controls.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(images / f"{name}.png")
    (images / f"{name}.txt").write_text(f"picture {name}")
    Image.fromarray(255 - arr).save(controls / f"{name}_0.bmp")
    Image.fromarray(np.ascontiguousarray(arr[..., ::-1])).save(controls / f"{name}_1.png")


def assert_references_aligned(pixels: torch.Tensor, references: torch.Tensor, tolerance: float) -> None:
    """references [6, H, W]: the inverted image, then the image with its channels reversed."""
    assert references.shape == (6, *pixels.shape[1:])
    first, second = references[:3], references[3:]
    assert (pixels + first).abs().max() <= tolerance
    assert (pixels.flip(0) - second).abs().max() <= tolerance
    assert (pixels[..., 1:] + first[..., :-1]).abs().max() > 10 * tolerance  # the check would see a 1-pixel shift
    assert (pixels - second).abs().max() > 10 * tolerance                     # ... and the references swapped


def avg_pool_encoder(pixels: torch.Tensor) -> torch.Tensor:
    """A stand-in VAE that commutes with inversion and channel order: 8× average pooling."""
    assert pixels.shape[1] == 3, "each reference is encoded on its own"
    return torch.nn.functional.avg_pool2d(pixels, 8)


def test_two_references_stay_aligned_in_order_through_bucketing_crop_flip_and_the_cache(tmp_path):
    images, controls = tmp_path / "images", tmp_path / "controls"
    for i, (w, h) in enumerate(((96, 64), (64, 96), (80, 80), (96, 64))):
        reference_pair(images, controls, f"img{i}", w, h, seed=i)
    cfg = config({"path": str(images), "control_path": str(controls), "bucketing": True, "bucket_step": 16,
                  "flip": True, "center_crop": False, "repeats": 3, "cache_both_flips": True})
    scan = scan_dataset(cfg)
    assert scan.warnings == [] and len(scan.items) == 4
    assert {item.path.stem: [p.name for p in item.controls] for item in scan.items}["img2"] == [
        "img2_0.bmp", "img2_1.png"]
    ds = TrainDataset(scan, cfg)
    flips, shapes = set(), set()
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            sample = ds[i]
            assert_references_aligned(sample["pixel_values"], sample["control_pixel_values"], ONE_STEP)
            flips.add(ds._sample_plan(i)[0])
            shapes.add(tuple(sample["pixel_values"].shape))
    assert flips == {True, False} and len(shapes) >= 3
    same_bucket = [i for i in range(len(ds)) if ds.sample_buckets[i] == ds.sample_buckets[0]][:2]
    batch = collate([ds[i] for i in same_bucket])
    assert batch["control_pixel_values"].shape == (2, 6, *batch["pixel_values"].shape[2:])

    ds.cache_latents(avg_pool_encoder, tmp_path / "cache", progress=False, vae_id="pool")
    for i in range(len(ds)):
        sample = ds[i]
        assert sample["control_latents"].shape == (6, *sample["latents"].shape[1:])
        assert_references_aligned(sample["latents"], sample["control_latents"], ONE_STEP)
    # a second dataset reads the same references back from the disk cache, encoding nothing
    again = TrainDataset(scan_dataset(cfg), cfg)
    again.cache_latents(avg_pool_encoder, tmp_path / "cache", progress=False, vae_id="pool")
    assert again.encoded_count == 0
    torch.testing.assert_close(again[0]["control_latents"], ds[0]["control_latents"])


def test_the_naming_rule_a_missing_reference_skips_the_image_with_one_warning(tmp_path):
    """`a.png` = one reference; `b_0, b_1` = two; `c_0, c_2` has a gap (c_1 missing) and `d` has none:
    both skipped, named in one warning. Different counts in one batch are refused naming the key."""
    images, controls = tmp_path / "images", tmp_path / "controls"
    for i, name in enumerate("abcd"):
        reference_pair(images, controls, name, 64, 64, seed=i)
    (controls / "a_0.bmp").rename(controls / "a.bmp")
    (controls / "a_1.png").unlink()
    (controls / "c_1.png").rename(controls / "c_2.png")
    for path in controls.glob("d_*"):
        path.unlink()
    scan = scan_dataset(config({"path": str(images), "control_path": str(controls)}))
    assert {item.path.stem: [p.name for p in item.controls] for item in scan.items} == {
        "a": ["a.bmp"], "b": ["b_0.bmp", "b_1.png"]}
    warned = [w for w in scan.warnings if "dataset.control_path" in w]
    assert len(warned) == 1 and "2 of 4 images" in warned[0] and "c.png" in warned[0] and "d.png" in warned[0]
    with pytest.raises(ConfigError, match="schedule.batch_size"):
        scan_dataset(config({"path": str(images), "control_path": str(controls)}, schedule={"batch_size": 2}))


def test_more_references_than_the_model_takes_are_refused_naming_the_folder(tmp_path):
    from trainer_backend.data.pairs import check_reference_limit
    from trainer_backend.families.registry import entry
    images, controls = tmp_path / "images", tmp_path / "controls"
    reference_pair(images, controls, "a", 64, 64, seed=0)
    scan = scan_dataset(config({"path": str(images), "control_path": str(controls)}))
    assert entry("qwen_image_edit").max_control_images == 1 and entry("qwen_image_edit_plus").max_control_images == 3
    with pytest.raises(ConfigError, match=r"dataset.control_path: a.png has 2 reference images .* takes one"):
        check_reference_limit(scan.items, scan.groups, 1, "Qwen-Image-Edit")
    check_reference_limit(scan.items, scan.groups, 3, "Qwen-Image-Edit-2509/2511")  # fits


def test_sample_prompts_repeat_control_for_each_reference(tmp_path):
    from trainer_backend.config import rules
    from trainer_backend.config.sample_prompts import SamplePrompt, parse_prompt_line
    line = "put the cat on the sofa --control refs/cat.png --control refs/sofa.png --s 4"
    prompt = parse_prompt_line(line, SamplePrompt(prompt=""))
    assert prompt.controls == ("refs/cat.png", "refs/sofa.png") and prompt.steps == 4
    data = {"dataset": {"path": str(tmp_path), "control_path": str(tmp_path / "c")}}
    four = line + " --control a.png --control b.png"
    for arch, text, bad in (("qwen_image_edit_plus", line, False), ("qwen_image_edit_plus", four, True),
                            ("qwen_image_edit", line, True)):
        problems = [p for p in rules.problems(from_dict({**data, "model": {"arch": arch}, "samples": {
            "prompts": text}})) if p.key == "samples.prompts"]
        assert bool(problems) == bad, (arch, problems)
        if bad:
            assert "--control images" in problems[0].message


def _two_reference_batch() -> dict:
    rng = np.random.default_rng(0)
    refs = [torch.from_numpy(rng.integers(0, 256, (3, 64, 64))).float() / 127.5 - 1 for _ in range(2)]
    return {"caption": ["put the red square on the blue one"], "control_pixel_values": torch.cat(refs)[None]}


def _pil(pixels: torch.Tensor) -> list[Image.Image]:
    from trainer_backend.families.qwen_image.text import to_pil
    return to_pil(pixels.view(-1, 3, *pixels.shape[-2:]))


@pytest.mark.parametrize("arch", PLUS)
def test_two_references_condition_like_the_pipeline_and_the_lora_loads_there(arch, tiny_models, tmp_path):
    """The text encoder's inputs ("Picture 1:", "Picture 2:", each reference at ~384² px) and the transformer
    call (both references' tokens after the target's, one img_shapes entry each) equal the pipeline's; a
    LoRA file (each layout) loaded into QwenImageEditPlusPipeline gives the trained model's output."""
    from trainer_backend.families import load_model
    from trainer_backend.families.qwen_image.text import condition_image
    folder = tiny_models(arch)
    batch = _two_reference_batch()
    refs = _pil(batch["control_pixel_values"])
    for layout in ("diffusers", "kohya"):
        model = load_model(str(folder))
        family = model.family
        assert family.name == "qwen_image_edit_plus"
        assert model.denoiser.config.zero_cond_t == arch.endswith("2511")  # 2511's flag from the folder's config
        path = _randomized_adapters(model, layout, tmp_path)
        pipe = _pipe(family, folder)
        assert type(pipe).__name__ == "QwenImageEditPlusPipeline"
        pipe.load_lora_weights(str(path))
        with torch.no_grad():
            batch["control_latents"] = family.encode_latents(model, batch["control_pixel_values"].view(2, 3, 64, 64),
                                                             None).view(1, 8, 8, 8)
            text = family.encode_text(model, family.tokenize_batch(model, batch, 75))
            embeds, mask = pipe.encode_prompt(prompt=batch["caption"], image=[condition_image(r) for r in refs],
                                              device=torch.device("cpu"))
            n = text["hidden"].shape[1]
            torch.testing.assert_close(text["hidden"], embeds[:, :n], rtol=1e-5, atol=1e-5)
            latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(3))
            ours = family.predict(model, model.denoiser, latents, torch.tensor([500.0]), text, batch, torch.float32)
            references = [pipe._encode_vae_image(r[None, :, None], None) for r in batch["control_pixel_values"][0]
                          .view(2, 3, 64, 64)]
            tokens = torch.cat([pipe._pack_latents(latents, 1, 4, 8, 8),
                                *(pipe._pack_latents(r[:, :, 0], 1, 4, 8, 8) for r in references)], dim=1)
            out = pipe.transformer(hidden_states=tokens, timestep=torch.tensor([0.5]), encoder_hidden_states=embeds,
                                   encoder_hidden_states_mask=mask, img_shapes=[[(1, 4, 4)] * 3],
                                   return_dict=False)[0][:, :16]
        torch.testing.assert_close(ours, pipe._unpack_latents(out, 64, 64, 8)[:, :, 0], rtol=1e-5, atol=1e-5)


def test_a_two_reference_run_trains_from_cached_latents_and_samples_with_both(tmp_path, tiny_models):
    """Cached latents: the text encoder reads both references back from their latents each step; a
    sample prompt with two --control images is rendered by QwenImageEditPlusPipeline."""
    data, controls = tmp_path / "data", tmp_path / "controls"
    for i in range(3):
        reference_pair(data, controls, f"img{i}", 32, 32, seed=i)
    prompt = f"put img0 on img1 --control {controls / 'img0_0.bmp'} --control {controls / 'img1_1.png'} --s 1"
    run, events, _ = train_run(tmp_path, tiny_models("qwen_image_edit_plus"), data, "plus", "schedule.max_steps=2",
                               f"dataset.control_path={controls}", "optimizer.lr=1e-2", "dataset.cache_latents=true",
                               f"samples.prompts={prompt}", "samples.every_n_steps=2", "samples.cfg_scale=1")
    assert [e["step"] for e in events if e["event"] == "step"] == [1, 2]
    (sample,) = [e for e in events if e["event"] == "sample"]
    assert len(sample["paths"]) == 1 and Image.open(sample["paths"][0]).size == (32, 32)
    lora = load_file(str(run / "plus.safetensors"))
    assert any(v.abs().max() > 0 for k, v in lora.items() if "lora_B" in k), "training did not move"


def test_full_size_comfyui_layout_keys_all_load_in_diffusers():
    """The kohya/ComfyUI layout of Edit-2509/2511's full-size transformer (meta device) loads through
    diffusers' converter onto exactly the adapted modules (the diffusers layout: the conformance suite)."""
    test_qwen_image.test_full_size_comfyui_layout_keys_all_load_in_diffusers("qwen_image_edit_plus")
