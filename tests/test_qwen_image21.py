"""Qwen-Image 2.1 beyond the conformance suite (which trains it on plain captions): the text
conditioning, the control latents, the shift and the training forward call are what QwenImage21Pipeline
computes on the same inputs, for generation and for an edit pair; an edit run trains on pairs and its
LoRA changes the edited image in diffusers; the transformer single file is read back by diffusers'
own converter."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.families import get_family, load_model

RED = Image.new("RGB", (64, 64), (200, 30, 30))


@pytest.fixture(scope="module")
def tiny(tiny_models):
    folder = tiny_models("qwen_image21")
    model = load_model(str(folder))
    pipe = model.family.build_pipeline(model)
    return folder, model, pipe


def _batch(captions, control: bool) -> dict:
    batch = {"caption": captions}
    if control:
        red = torch.from_numpy(np.array(RED)).permute(2, 0, 1).float() / 127.5 - 1
        batch["control_pixel_values"] = torch.stack([red] * len(captions))
    return batch


@pytest.mark.parametrize("control", [False, True], ids=["generate", "edit"])
def test_text_conditioning_is_what_the_pipeline_encodes(tiny, control):
    """Captions of different lengths in one batch: valid tokens, mask and image-slot mask equal
    the pipeline's encode_prompt (template, dropped system tokens, the layer before the final norm)."""
    _, model, pipe = tiny
    family = model.family
    captions = ["a red square", "make the small square blue and put it on a plain white background"]
    with torch.no_grad():
        ours = family.encode_text(model, family.tokenize_batch(model, _batch(captions, control), 75))
        theirs, mask, slots = pipe.encode_prompt(prompt=captions, device=torch.device("cpu"),
                                                 image=[RED] if control else None)
    assert mask is not None and not mask.all()  # the shorter caption is padded
    assert int(slots[0].sum()) == (4 if control else 0)  # 64² px: 2×2 vision tokens
    for i in range(2):
        n = int(mask[i].sum())
        assert int(ours["mask"][i].sum()) == n
        torch.testing.assert_close(ours["hidden"][i, :n], theirs[i, :n], rtol=1e-5, atol=1e-5)
        assert torch.equal(ours["image_slots"][i, :n], slots[i, :n])


@pytest.mark.parametrize("control", [False, True], ids=["generate", "edit"])
def test_the_training_forward_call_is_the_pipelines_transformer_call(tiny, control):
    """family.predict on fixed latents equals the transformer called as the pipeline calls it (the
    control image's latents from the pipeline's own _encode_vae_image, tokens packed by its
    _pack_latents), and the resolution shift is its calculate_shift over the same tokens."""
    from diffusers.pipelines.qwenimage21.pipeline_qwenimage21 import calculate_shift
    from trainer_backend.config import load_config
    _, model, pipe = tiny
    family = model.family
    latents = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(3))
    batch = _batch(["a red square"], control)
    with torch.no_grad():
        tokens, shapes = pipe._pack_latents(latents, 1, 4, 4, 4), [(1, 4, 4)]
        if control:
            batch["control_latents"] = family.encode_latents(model, batch["control_pixel_values"], None)
            rgba = torch.cat([batch["control_pixel_values"], torch.ones(1, 1, 64, 64)], dim=1).unsqueeze(2)
            reference = pipe._encode_vae_image(rgba, None)[:, :, 0]
            torch.testing.assert_close(batch["control_latents"], reference, rtol=1e-5, atol=1e-5)
            tokens = torch.cat([pipe._pack_latents(reference, 1, 4, 4, 4), tokens], dim=1)
            shapes.insert(0, (1, 4, 4))
        text = family.encode_text(model, family.tokenize_batch(model, batch, 75))
        ours = family.predict(model, model.denoiser, latents, torch.tensor([500.0]), text, batch, torch.float32)
        embeds, mask, slots = pipe.encode_prompt(prompt=["a red square"], device=torch.device("cpu"),
                                                 image=[RED] if control else None)
        img_mask = torch.cat([slots, slots.new_ones(1, 4)], dim=1)
        out = pipe.transformer(hidden_states=tokens, timestep=torch.tensor([0.5]), encoder_hidden_states=embeds,
                               encoder_hidden_states_mask=mask, img_shapes=[shapes], img_mask=img_mask,
                               return_dict=False)[0][:, -16:]
    torch.testing.assert_close(ours, pipe._unpack_latents(out, 64, 64, 16)[:, :, 0], rtol=1e-5, atol=1e-5)
    # the shift at 1024² (64×64 latent cells = 4096 tokens): exp(mu) of the pipeline's calculate_shift
    objective = family.objective(model)
    c = model.scheduler_config
    mu = calculate_shift(4096, c["base_image_seq_len"], c["max_image_seq_len"], c["base_shift"], c["max_shift"])
    assert objective._shift((64, 64, 64), load_config(None, []).loss) == pytest.approx(np.exp(mu))


def test_an_edit_run_trains_on_pairs_and_its_lora_changes_the_edited_image(tmp_path, tiny):
    folder, model, _ = tiny
    family = model.family
    data = make_dataset(tmp_path / "data", n=2, size=64)
    control = make_dataset(tmp_path / "control", n=2, size=64, seed=7)
    run, events, _ = train_run(tmp_path, folder, data, "edit", "schedule.max_steps=2", "dataset.resolution=64",
                               f"dataset.control_path={control}", "optimizer.lr=1e-2")
    assert [e["event"] for e in events][-1] == "done"
    pipe = family.pipeline_class().from_pretrained(
        str(folder), local_files_only=True, processor=load_model(str(folder)).tokenizers[0])
    pipe.set_progress_bar_config(disable=True)

    def edited():
        return torch.from_numpy(pipe(prompt="a red square", image=RED, num_inference_steps=2, height=64, width=64,
                                     generator=torch.Generator().manual_seed(0), output_type="np",
                                     output_resolution=64).images[0])
    before = edited()
    pipe.load_lora_weights(str(run / "edit.safetensors"))
    assert (edited() - before).abs().max() > 1e-4, "the LoRA did not change the edited image"


def test_the_transformer_single_file_reads_back_through_diffusers_converter(tmp_path, tiny):
    """ComfyUI's layout (gate and up fused, gate first): diffusers' converter restores every weight."""
    from diffusers.loaders.single_file_utils import convert_qwen_image21_transformer_checkpoint_to_diffusers
    _, model, _ = tiny
    path = model.family.export_single_file(model, tmp_path / "t.safetensors", None, {})
    state = load_file(str(path))
    assert "transformer_blocks.0.img_mlp.gate_up.weight" in state and model.family.detect_file(
        {k: tuple(v.shape) for k, v in state.items()}, {})
    back = convert_qwen_image21_transformer_checkpoint_to_diffusers(state)
    ours = model.denoiser.state_dict()
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)


def test_a_hub_id_downloads_the_processor_and_loads(tiny_models, tmp_path, monkeypatch):
    """`org/name` through trainer_backend/model_sources with the family's default hub files: the
    processor folder (tokenizer, image processor, chat template) comes with the weights and loads offline."""
    from hub_server import HubServer, point_client_at
    from trainer_backend.model_sources import resolve_model
    server = HubServer().start()
    try:
        server.add_folder("org/tiny-qwen-image-2.1", tiny_models("qwen_image21"))
        point_client_at(monkeypatch, server, tmp_path / "hf")
        folder = resolve_model("org/tiny-qwen-image-2.1")
    finally:
        server.stop()
    assert (folder / "processor" / "chat_template.json").is_file()
    loaded = load_model(str(folder))
    assert loaded.family.name == "qwen_image21" and loaded.tokenizers[0].chat_template
