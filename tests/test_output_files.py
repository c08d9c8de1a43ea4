"""What other tools see of a run's outputs: the full fine-tune's diffusers folder in the layout
transformers-4 tools read (kohya's sd-scripts, older diffusers), and file modes that follow the
umask (a webui running as another user can read the LoRA and the checkpoints)."""
from __future__ import annotations

import os
import shutil
import stat

import pytest
import torch
from safetensors.torch import load_file

from conftest import make_dataset
from method_runs import train_run


@pytest.fixture()
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _modes(root):
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    return {str(p.relative_to(root.parent)): stat.S_IMODE(p.stat().st_mode) for p in paths}


def test_full_finetune_folder_loads_with_transformers_4_layout(tmp_path, tiny_models, umask_022):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, _, _ = train_run(tmp_path, tiny_models("sd1"), data, "ft", "network.type=full", "schedule.max_steps=2",
                          "optimizer.lr=1e-3", "network.train_text_encoder=true", "checkpoints.every_n_steps=2")
    folder = run / "ft-diffusers"

    # tokenizer: vocab.json + merges.txt, and a tokenizer built from them alone tokenizes the same
    tok_dir = folder / "tokenizer"
    assert (tok_dir / "vocab.json").is_file()
    assert (tok_dir / "merges.txt").read_text(encoding="utf-8").startswith("#version: 0.2\n")
    bpe_only = tmp_path / "bpe-only"
    bpe_only.mkdir()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(tok_dir / name, bpe_only / name)
    prompt = "a red square on a plain background, sks"
    assert CLIPTokenizer.from_pretrained(str(bpe_only))(prompt).input_ids == \
        CLIPTokenizer.from_pretrained(str(tok_dir))(prompt).input_ids

    # text encoder: the keys transformers 4's CLIPTextModel has (text_model.embeddings..., ...)
    te_dir = folder / "text_encoder"
    saved = load_file(str(te_dir / "model.safetensors"))
    flat = CLIPTextModel(CLIPTextConfig.from_pretrained(str(te_dir))).state_dict()
    assert set(saved) == {"text_model." + k for k in flat}
    # ... and transformers 5 / diffusers still load the trained weights from it (not random ones)
    loaded = CLIPTextModel.from_pretrained(str(te_dir))
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, saved["text_model." + key]), key

    # item 16: every output and checkpoint file is 0644 under umask 022, folders 0755
    for root in (run / "ft.safetensors", folder, *sorted((run / "checkpoints").glob("step-*"))):
        for rel, mode in _modes(root).items():
            want = 0o755 if (root.parent / rel).is_dir() else 0o644
            assert mode == want, f"{rel}: {oct(mode)}"


def test_lora_output_follows_the_umask(tmp_path, tiny_models, umask_022):
    data = make_dataset(tmp_path / "data", n=2, size=32)
    run, _, _ = train_run(tmp_path, tiny_models("sd1"), data, "lo", "schedule.max_steps=1")
    assert stat.S_IMODE((run / "lo.safetensors").stat().st_mode) == 0o644
    os.umask(0o027)
    run, _, _ = train_run(tmp_path, tiny_models("sd1"), data, "lo2", "schedule.max_steps=1")
    assert stat.S_IMODE((run / "lo2.safetensors").stat().st_mode) == 0o640
