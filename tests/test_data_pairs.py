"""Paired control images (dataset.control_path): matched by file name, kept aligned with their
training image through bucketing, random crop, flip and the latent cache, skipped with one warning when
missing, refused where the family does not fit, shown side by side by the inspector. The control image
is a deterministic function of its training image (the colours inverted), so alignment is checked
pixel by pixel: a one-pixel shift or a missed flip breaks it."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from test_data_helpers import config
from trainer_backend.config import ConfigError, load_config
from trainer_backend.data import TrainDataset, collate, scan_dataset

ONE_STEP = 1.0 / 127.5 + 1e-6   # one 8-bit level in [-1, 1]: resampling rounds the inverted image apart


def noise_pair(images: Path, controls: Path, name: str, width: int, height: int, seed: int,
               control_ext: str = ".bmp") -> None:
    """A random-noise image (any misalignment shows) and its inverted twin as the control image,
    saved under another extension: pairs are matched by file stem."""
    arr = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    for folder, pixels, ext in ((images, arr, ".png"), (controls, 255 - arr, control_ext)):
        path = folder / f"{name}{ext}"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(path)
    (images / f"{name}.txt").write_text(f"picture {name}")


def paired_folder(tmp_path: Path, sizes=((96, 64), (64, 96), (80, 80))) -> tuple[Path, Path]:
    images, controls = tmp_path / "images", tmp_path / "controls"
    for i, (w, h) in enumerate(sizes):
        noise_pair(images, controls, f"img{i}", w, h, seed=i)
    return images, controls


def assert_aligned(pixels: torch.Tensor, control: torch.Tensor) -> None:
    assert control.shape == pixels.shape
    assert (pixels + control).abs().max() <= ONE_STEP              # control == inverted image, pixel by pixel
    assert (pixels[..., 1:] + control[..., :-1]).abs().max() > 0.5  # ... and the check sees a 1-pixel shift


def test_a_pair_stays_aligned_through_bucketing_random_crop_and_flip(tmp_path):
    images, controls = paired_folder(tmp_path)
    # a kohya N_concept subfolder: its control images sit in the same relative sub-folder
    noise_pair(images / "3_dog", controls / "3_dog", "dog", 72, 88, seed=7)
    cfg = config({"path": str(images), "control_path": str(controls), "bucketing": True, "bucket_step": 16,
                  "flip": True, "center_crop": False, "repeats": 4})
    scan = scan_dataset(cfg)
    assert scan.warnings == [] and len(scan.items) == 4
    assert {item.path.stem: item.control.name for item in scan.items} == {
        "img0": "img0.bmp", "img1": "img1.bmp", "img2": "img2.bmp", "dog": "dog.bmp"}
    assert scan.items[-1].control.parent.name == "3_dog"
    ds = TrainDataset(scan, cfg)
    crops, flips, shapes = set(), set(), set()
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        for i in range(len(ds)):
            sample = ds[i]
            pixels, control = sample["pixel_values"], sample["control_pixel_values"]
            assert_aligned(pixels, control)
            crops.add((i % 4, sample["crop_top_left"]))
            flips.add(ds._sample_plan(i)[0])
            shapes.add(tuple(pixels.shape))
    assert flips == {True, False} and len(shapes) >= 3     # both orientations, several buckets
    assert len(crops) > len(ds) // 4                        # random crops moved
    batch = collate([ds[0], ds[1]])
    assert batch["control_pixel_values"].shape == batch["pixel_values"].shape


def test_a_control_image_of_another_size_or_aspect_is_fitted_into_the_bucket(tmp_path):
    """Twice the size (same aspect): resized into the training image's bucket and still aligned;
    another aspect: centre-cropped to the training image's aspect, never stretched."""
    images, controls = tmp_path / "images", tmp_path / "controls"
    y, x = np.mgrid[0:64, 0:96]
    smooth = np.stack([127 + 100 * np.sin(x / 7.0), 127 + 100 * np.cos(y / 5.0), 2 * x], -1).astype(np.uint8)
    images.mkdir()
    controls.mkdir()
    Image.fromarray(smooth).save(images / "a.png")
    Image.fromarray(255 - smooth).resize((192, 128), Image.Resampling.BICUBIC).save(controls / "a.png")
    wide = np.zeros((64, 160, 3), np.uint8)                 # 96 columns of the inverted image, 32 black each side
    wide[:, 32:128] = 255 - smooth
    Image.fromarray(smooth).save(images / "b.png")
    Image.fromarray(wide).save(controls / "b.png")
    cfg = config({"path": str(images), "control_path": str(controls), "bucketing": True, "bucket_step": 16,
                  "flip": True})
    ds = TrainDataset(scan_dataset(cfg), cfg)
    for i in range(len(ds)):
        sample = ds[i]
        pixels, control = sample["pixel_values"], sample["control_pixel_values"]
        assert control.shape == pixels.shape
        assert (pixels + control).abs().mean() < 0.03
        assert (pixels + control.flip(-1)).abs().mean() > 0.2   # a missed flip would show


@pytest.fixture(scope="module")
def sd1_model(tiny_models):
    from trainer_backend.families.registry import get_family
    return get_family("sd1").load(Path(tiny_models("sd1")))


def variant(family, cls):
    """A copy of a real Family object as a test-only subclass `cls` of its class (its own attributes kept)."""
    import copy
    twin = copy.copy(family)
    twin.__class__ = cls
    return twin


class CountingEncoder:
    """The trainer's cache encoder (training/setup.py): family.encode_latents with eps=None."""

    def __init__(self, model):
        self.model, self.images = model, 0

    @torch.no_grad()
    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        self.images += len(pixels)
        return self.model.family.encode_latents(self.model, pixels, None)


def test_cached_latents_keep_each_pair_together_and_a_changed_control_image_is_re_encoded(tmp_path, sd1_model):
    images, controls = paired_folder(tmp_path, sizes=((96, 64), (64, 64)))
    cfg = config({"path": str(images), "control_path": str(controls), "bucketing": True, "bucket_step": 16,
                  "flip": True, "repeats": 4, "cache_latents": True})
    plain = TrainDataset(scan_dataset(cfg), cfg)           # center crop: the cached crop is the same
    cache = tmp_path / "cache"

    def cached():
        ds, encoder = TrainDataset(scan_dataset(cfg), cfg), CountingEncoder(sd1_model)
        ds.cache_latents(encoder, cache, progress=False, vae_id="tiny")
        return ds, encoder.images

    ds, encoded = cached()
    assert encoded == 2 * 2 * 2                             # 2 pairs × both flips × (image + control)
    encode = CountingEncoder(sd1_model)
    served = set()
    for i in range(len(ds)):
        sample, pixels = ds[i], plain[i]
        assert "pixel_values" not in sample and "control_pixel_values" not in sample
        assert torch.allclose(sample["latents"], encode(pixels["pixel_values"][None])[0], atol=1e-5)
        assert torch.allclose(sample["control_latents"], encode(pixels["control_pixel_values"][None])[0],
                              atol=1e-5)
        served.add(round(sample["control_latents"].sum().item(), 3))
    assert len(served) == 4                                 # both orientations of both control images
    assert collate([ds[0], ds[1]])["control_latents"].shape == collate([ds[0], ds[1]])["latents"].shape

    assert cached()[1] == 0                                 # reused from disk
    arr = np.asarray(Image.open(controls / "img1.bmp")).copy()
    arr[:8] = 0
    Image.fromarray(arr).save(controls / "img1.bmp")
    os.utime(controls / "img1.bmp", ns=(1, 1))
    again, encoded = cached()
    assert encoded == 1 * 2 * 2                             # only the edited pair, both flips
    edited = next(i for i in range(len(again)) if again.items[again.sample_items[i]].path.stem == "img1")
    assert not torch.allclose(again[edited]["control_latents"], ds[edited]["control_latents"])


def test_the_loss_hands_predict_the_control_latents_of_the_posterior_mean(tmp_path, sd1_model):
    """Without a latent cache, diffusion_loss encodes control_pixel_values (eps=None) into
    batch["control_latents"], which the family's predict reads."""
    from trainer_backend.data.indexed import collate_with_index
    from trainer_backend.diffusion.loss import diffusion_loss
    images, controls = paired_folder(tmp_path, sizes=((64, 64), (64, 64)))
    cfg = config({"path": str(images), "control_path": str(controls), "flip": True})
    ds = TrainDataset(scan_dataset(cfg), cfg)
    batch = collate_with_index([(i, ds[i]) for i in range(2)])
    family, seen = sd1_model.family, []

    class Recording(type(family)):                          # SD1 itself, recording what predict is given
        def predict(self, model, denoiser, noisy, timesteps, text, batch, dtype, cfg=None):
            seen.append(batch["control_latents"])
            return super().predict(model, denoiser, noisy, timesteps, text, batch, dtype, cfg=cfg)

    sd1_model.family = variant(family, Recording)
    try:
        loss = diffusion_loss(sd1_model, sd1_model.denoiser, batch, cfg=cfg, epoch=0, device=torch.device("cpu"),
                              weight_dtype=torch.float32)
    finally:
        sd1_model.family = family
    expected = family.encode_latents(sd1_model, batch["control_pixel_values"], None)
    assert torch.isfinite(loss) and torch.allclose(seen[0], expected, atol=1e-6)
    assert "control_latents" not in batch                   # the caller's batch is left as it was


def test_a_missing_control_image_is_one_warning_and_the_image_is_skipped(tmp_path):
    images, controls = paired_folder(tmp_path, sizes=[(64, 64)] * 3)
    for i in range(3, 10):                                  # 7 more images without a control image
        Image.fromarray(np.full((64, 64, 3), i * 20, np.uint8)).save(images / f"lonely{i}.png")
    cfg = config({"path": str(images), "control_path": str(controls)})
    scan = scan_dataset(cfg)
    assert sorted(item.path.stem for item in scan.items) == ["img0", "img1", "img2"]   # never trained unpaired
    assert len(scan.warnings) == 1
    warning = scan.warnings[0]
    assert warning.startswith("dataset.control_path: 7 of 10 images") and "skipped" in warning
    assert "lonely3.png" in warning and "…" in warning      # the first few names, then "…"
    summary = scan.summary
    assert summary["missing_controls"] == 7 and summary["control_images"] == 3
    assert summary["skipped_by_kind"] == {"no_control": 7}
    assert len(summary["missing_control_files"]["dataset.control_path"]) == 7
    assert summary["subsets"][0]["missing_controls"] == 7
    assert scan.counts.subsets[0][1] == 3                   # the plan counts the pairs only

    for p in controls.iterdir():
        p.unlink()
    with pytest.raises(ConfigError, match=r"dataset.path: no usable image left.*10 no control"):
        scan_dataset(cfg)


def test_a_broken_control_image_skips_its_pair_and_subsets_pair_their_own_folders(tmp_path):
    images, controls = paired_folder(tmp_path, sizes=[(64, 64)] * 2)
    (controls / "img1.bmp").write_bytes(b"not an image")
    extra, extra_controls = tmp_path / "extra", tmp_path / "extra_controls"
    noise_pair(extra, extra_controls, "x", 64, 64, seed=9)
    cfg = config({"path": str(images), "control_path": str(controls),
                  "subsets": [{"path": str(extra), "control_path": str(extra_controls)}]})
    scan = scan_dataset(cfg)
    assert [(item.path.name, item.control.name) for item in scan.items] == [("img0.png", "img0.bmp"),
                                                                              ("x.png", "x.bmp")]
    assert scan.summary["skipped_by_kind"] == {"bad_control": 1}
    assert "img1.png: skipped: its control image" in scan.warnings[0]
    missing = config({"path": str(images), "control_path": str(tmp_path / "nowhere")})
    with pytest.raises(ConfigError, match=r"^dataset.control_path: .*nowhere is not a folder"):
        scan_dataset(missing)


def test_changed_control_images_change_the_resume_fingerprint_a_moved_folder_does_not(tmp_path):
    from trainer_backend.run.resume import dataset_fingerprint
    images, controls = paired_folder(tmp_path, sizes=[(64, 64)] * 2)
    cfg = config({"path": str(images), "control_path": str(controls)})
    before = dataset_fingerprint(scan_dataset(cfg))
    moved = tmp_path / "moved_controls"
    controls.rename(moved)
    assert dataset_fingerprint(scan_dataset(config({"path": str(images), "control_path": str(moved)}))) == before
    Image.new("RGB", (48, 48)).save(moved / "img0.bmp")     # another control image (another size on disk)
    after = dataset_fingerprint(scan_dataset(config({"path": str(images), "control_path": str(moved)})))
    assert after != before and after.split(":")[0] == before.split(":")[0]


# ----------------------------------------------------------------------------- config rules

def problems_of(overrides: list[str]):
    from trainer_backend.config.checks import run_problems
    return run_problems(load_config(None, ["model.path=builtin:tiny-sd1", *overrides]))


def test_a_family_without_control_images_refuses_a_control_folder(tmp_path):
    images, controls = paired_folder(tmp_path, sizes=[(64, 64)])
    found = problems_of([f"dataset.path={images}", f"dataset.control_path={controls}", "model.arch=sd1",
                         f"output.dir={tmp_path / 'runs'}"])
    assert [p.key for p in found] == ["dataset.control_path"]
    assert "sd1 (model.arch) takes no control images" in found[0].message
    auto = problems_of([f"dataset.path={images}", f"dataset.control_path={controls}", f"output.dir={tmp_path / 'r'}"])
    assert auto == []                                       # auto: checked once the model loads


def test_an_auto_model_is_checked_once_its_family_is_known(tmp_path, tiny_models):
    from trainer_backend.methods import load_method_model
    images, controls = paired_folder(tmp_path, sizes=[(64, 64)])
    cfg = load_config(None, [f"model.path={tiny_models('sd1')}", f"dataset.path={images}",
                             f"dataset.control_path={controls}"])
    with pytest.raises(ConfigError, match=r"^dataset.control_path: sd1 \(model.arch\) takes no control images"):
        load_method_model(cfg)


def test_control_folder_problems_are_named(tmp_path):
    images, _ = paired_folder(tmp_path, sizes=[(64, 64)])
    found = problems_of([f"dataset.path={images}", f"dataset.control_path={tmp_path / 'missing'}",
                         f"output.dir={tmp_path / 'runs'}"])
    assert [p.key for p in found] == ["dataset.control_path"] and "is not a folder" in found[0].message
    inside = images / "controls"
    inside.mkdir()
    found = problems_of([f"dataset.path={images}", f"dataset.control_path={inside}", f"output.dir={tmp_path / 'r'}"])
    assert [p.key for p in found] == ["dataset.control_path"] and "would be trained as images" in found[0].message


def test_edit_models_require_a_control_folder_everywhere_and_batches_never_mix():
    """control_problems is the rule for a family's Family.control_images (no registered family takes
    control images yet: the rule is run with each mode)."""
    from trainer_backend.config.control_rules import control_problems
    two = ["dataset.path=a", "dataset.subsets=[{path = \"b\"}]"]
    required = list(control_problems(load_config(None, two), "required", "edit"))
    assert [p.key for p in required] == ["dataset.control_path", "dataset.subsets[0].control_path"]
    assert "edit (model.arch) is an edit model" in required[0].message
    half = load_config(None, [*two, "dataset.control_path=c"])
    # a model that generates and edits trains an unpaired folder beside a paired one (in batches of its own)
    assert list(control_problems(half, "optional", "edit")) == []
    assert list(control_problems(load_config(None, two), "optional", "edit")) == []   # unpaired: fine
    assert [p.key for p in control_problems(half, "", "sd1")] == ["dataset.control_path"]
    prior = load_config(None, ["dataset.path=a", "dataset.control_path=c", "dataset.class_path=k",
                               "validation.path=v"])
    assert [p.key for p in control_problems(prior, "required", "edit")] == ["dataset.class_path", "validation.path"]
    vae = load_config(None, ["dataset.path=a", "dataset.control_path=c", "network.type=vae"])
    assert [p.key for p in control_problems(vae, "required", "edit")] == ["dataset.control_path"]


def test_families_declare_their_control_images_alike_in_the_registry():
    """The config rules read the registry (no torch); the trainer reads the Family: they must agree."""
    from trainer_backend.families.registry import CONTROL_IMAGE_MODES, FAMILIES, get_family
    for entry in FAMILIES:
        family = get_family(entry.name)
        assert family.control_images == entry.control_images and entry.control_images in CONTROL_IMAGE_MODES
        assert family.max_control_images == entry.max_control_images >= 1  # the reference images it takes
        assert family.control_image_argument


# ----------------------------------------------------------------------------- sample prompts

def test_sample_prompt_control_images_are_parsed_and_checked(tmp_path):
    from trainer_backend.config.sample_prompts import SamplePrompt, control_line_problems, parse_prompt_line
    image = tmp_path / "before.png"
    Image.new("RGB", (32, 32), (200, 10, 10)).save(image)
    p = parse_prompt_line(f"make it blue --control {image} --s 4", SamplePrompt(""))
    assert (p.prompt, p.control, p.steps) == ("make it blue", str(image), 4)
    with pytest.raises(ValueError, match="--control needs an image file"):
        parse_prompt_line("x --control  --s 3", SamplePrompt(""))

    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"fine --control {image}\n# note\nbroken --control {tmp_path / 'gone.png'}\n")
    found = problems_of([f"samples.prompts=\"a --control {tmp_path / 'nope.jpg'}\"", f"samples.prompt_file={prompts}",
                         "dataset.path=assets/demo_dataset", f"output.dir={tmp_path / 'runs'}"])
    assert [str(p) for p in found] == [f"samples.prompts: line 1: --control {tmp_path / 'nope.jpg'}: no such image file",
                                       f"samples.prompt_file: line 3: --control {tmp_path / 'gone.png'}: no such "
                                       f"image file"]

    cfg = load_config(None, [f"samples.prompts=\"with --control {image}\\nwithout\""])
    assert list(control_line_problems(cfg, "samples.prompts", cfg.samples.prompts, "required", "edit")) == [
        ("samples.prompts", "line 2: edit (model.arch) is an edit model: add --control <image file> (the image the "
                            "prompt edits)")]
    assert list(control_line_problems(cfg, "samples.prompts", cfg.samples.prompts, "", "sd1")) == [
        ("samples.prompts", "line 1: --control: sd1 (model.arch) takes no control image")]
    found = problems_of([f"samples.prompts=\"with --control {image}\"", "model.arch=sd1",
                         "dataset.path=assets/demo_dataset", f"output.dir={tmp_path / 'r'}"])
    assert [p.key for p in found] == ["samples.prompts"]


def test_samples_load_each_prompts_control_image_for_the_family(tmp_path, sd1_model):
    from trainer_backend.config.sample_prompts import load_prompts
    from trainer_backend.diffusion.sampling import control_images
    image = tmp_path / "before.png"
    Image.new("RGBA", (40, 24), (0, 0, 255, 255)).save(image)
    cfg = load_config(None, [f"samples.prompts=\"edit --control {image}\\nplain\""])
    prompts = load_prompts(cfg)

    class Edit(type(sd1_model.family)):
        control_images = "required"

    with pytest.raises(ConfigError, match=r"'plain': sd1 is an edit model: add --control"):
        control_images(prompts, variant(sd1_model.family, Edit), cfg)
    with pytest.raises(ConfigError, match=r"'edit': --control: sd1 takes no control image"):
        control_images(prompts, sd1_model.family, cfg)

    class Optional(type(sd1_model.family)):
        control_images = "optional"

    loaded = control_images(prompts, variant(sd1_model.family, Optional), cfg)
    assert loaded[1] is None and loaded[0].mode == "RGB" and loaded[0].size == (40, 24)
    assert loaded[0].getpixel((0, 0)) == (0, 0, 255)


# ----------------------------------------------------------------------------- the studio's inspector

def test_the_inspector_shows_pairs_side_by_side_and_counts_the_unmatched(tmp_path):
    from gui import dataset_view as dv
    images, controls = paired_folder(tmp_path, sizes=[(64, 64), (96, 64)])
    Image.new("RGB", (64, 64)).save(images / "alone.png")
    summary = scan_dataset(config({"path": str(images), "control_path": str(controls)})).summary
    thumbs = dv.thumbnails(summary, size=32)
    assert len(thumbs) == 2 and all(caption.endswith("| control") for _, caption in thumbs)
    picture = np.asarray(thumbs[0][0]).astype(int)
    left, right = picture[:, :32], picture[:, 32 + 4:]        # image | 4-pixel gap | control
    assert np.abs(left + right - 255).mean() < 8              # the control beside its own image
    text = dv.summary_markdown(summary)
    assert "2 images paired with a control image" in text
    assert "1 images have no control image" in text and "`alone.png`" in text


def test_the_form_shows_a_refused_control_folder_even_where_it_does_not_apply(tmp_path):
    """dataset.control_path only applies to families that take control images; left set for sd1 it is
    refused, and the form shows it, outlined, with the message under it, instead of hiding it."""
    from gui.schema_form import config_to_values, field_visibility, form_fields, form_problems
    from gui.widgets import FormWidgets, error_updates, shown_errors
    fields = form_fields()
    dotted = [f.dotted for f in fields]
    (tmp_path / "c").mkdir()   # a real folder: the form also checks it exists (config/checks.py)
    for arch, refused in (("sd1", True), ("auto", False)):
        values = config_to_values(fields, load_config(None, [f"dataset.control_path={tmp_path / 'c'}",
                                                             f"model.arch={arch}"]))
        _, errors = form_problems(fields, values)
        placed = error_updates(fields, errors)
        visible = field_visibility(fields, values)
        updates = FormWidgets(fields=fields, inputs=[], errors=[], tabs=None).visibility_updates(
            visible, shown_errors(placed))
        i = dotted.index("dataset.control_path")
        assert visible[i] is not refused                    # it applies with auto only
        assert updates[i]["visible"] is True
        assert ("field-invalid" in updates[i]["elem_classes"]) is refused
        assert ("takes no control images" in placed[i].get("value", "")) is refused
