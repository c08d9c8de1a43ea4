"""SD3's CLIP-L and CLIP-G (CLIPTextModelWithProjection) as the separate files ComfyUI users keep
(`clip_l.safetensors`, `clip_g.safetensors`): what an SD3 full fine-tune that trained them writes beside
its single file, with `text_projection` kept. The key sets are the full-size release files' (meta
device), and `model.clip_l` / `model.clip_g` load them back with the very same pooled embeddings."""
from __future__ import annotations

import pytest
import torch

from conftest import make_dataset
from method_runs import train_run
from trainer_backend.families import load_model
from trainer_backend.families.component_files import bundled
from trainer_backend.families.sd3.components import clip_file_state, load_text_encoder, save_clip_file

# (bundled config, layers, width): CLIP ViT-L/14's text tower and OpenCLIP bigG's
FULL_SIZE = {"clip_l": ("text_encoder", 12, 768), "clip_g": ("text_encoder_2", 32, 1280)}


def _pooled_and_hidden(encoder, ids):
    with torch.no_grad():
        out = encoder(ids, output_hidden_states=True)
    return out[0], out.hidden_states[-2]


def _ids(encoder):
    return torch.randint(1, encoder.config.vocab_size - 1, (2, 77), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("option", FULL_SIZE)
def test_full_size_clip_file_keys_are_the_release_files(option):
    """Built on the meta device from the bundled full-size config: every weight of the architecture
    under transformers 4's names (as the SD3 release's text_encoders/clip_*.safetensors and ComfyUI's
    files have them), text_projection included at the tower's width; no position ids."""
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection
    config_name, layers, width = FULL_SIZE[option]
    with torch.device("meta"):
        encoder = CLIPTextModelWithProjection(CLIPTextConfig(**bundled("sd3", f"{config_name}/config.json")))
    state = clip_file_state(encoder)
    architecture = {k if k.startswith(("text_model.", "text_projection")) else "text_model." + k: tuple(v.shape)
                    for k, v in encoder.state_dict().items() if not k.endswith("position_ids")}
    assert {k: tuple(v.shape) for k, v in state.items()} == architecture
    assert state["text_projection.weight"].shape == (width, width)
    assert state["text_model.embeddings.token_embedding.weight"].shape == (49408, width)
    assert f"text_model.encoder.layers.{layers - 1}.mlp.fc1.weight" in state
    assert f"text_model.encoder.layers.{layers}.mlp.fc1.weight" not in state
    assert all(k.startswith(("text_model.", "text_projection.")) for k in state)


@pytest.mark.parametrize("option,index", [("clip_l", 0), ("clip_g", 1)])
def test_a_written_clip_file_loads_back_with_identical_pooled_embeddings(tiny_models, tmp_path, option, index):
    """The tiny SD3's CLIP (random, non-identity projection) written and loaded with model.<option>: the
    projected pooled output and the hidden states SD3 conditions on are bit-identical. CLIP-L's projection
    is kept because the file carries this project's config (someone else's clip_l.safetensors gets the
    identity, as diffusers' converter and ComfyUI give SD3)."""
    encoder = load_model(str(tiny_models("sd3"))).text_encoders[index]
    projection = encoder.text_projection.weight
    assert not torch.allclose(projection, torch.eye(*projection.shape)), "the test needs a real projection"
    path = save_clip_file(encoder, tmp_path / f"{option}.safetensors")
    loaded = load_text_encoder(option, str(path), path, {}, {})
    ids = _ids(encoder)
    for want, got in zip(_pooled_and_hidden(encoder, ids), _pooled_and_hidden(loaded, ids)):
        assert torch.equal(want, got)


def test_a_full_finetune_of_the_clips_writes_them_beside_the_single_file(tiny_models, tmp_path):
    """network.type = full with network.train_text_encoder: ft_clip_l / ft_clip_g.safetensors come with
    ft.safetensors; with model.clip_l / model.clip_g the single file loads the trained CLIPs (the diffusers
    folder's) and their pooled embeddings are identical; the CLIPs did train."""
    folder = tiny_models("sd3")
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, events, _ = train_run(tmp_path, folder, data, "ft", "network.type=full", "schedule.max_steps=1",
                               "optimizer.lr=1e-3", "network.train_text_encoder=true")
    files = {o: run / f"ft_{o}.safetensors" for o in FULL_SIZE}
    done = [e["outputs"] for e in events if e["event"] == "done"]
    assert done == [[str(p) for p in (run / "ft.safetensors", files["clip_l"], files["clip_g"], run / "ft-diffusers")]]
    from_files = load_model(str(run / "ft.safetensors"), tokenizer=str(folder),
                            text_encoder_files={o: str(p) for o, p in files.items()})
    from_folder, base = load_model(str(run / "ft-diffusers")), load_model(str(folder))
    for index in (0, 1):
        ids = _ids(base.text_encoders[index])
        trained = _pooled_and_hidden(from_folder.text_encoders[index], ids)
        for want, got in zip(trained, _pooled_and_hidden(from_files.text_encoders[index], ids)):
            assert torch.equal(want, got)
        assert not torch.equal(trained[0], _pooled_and_hidden(base.text_encoders[index], ids)[0])
