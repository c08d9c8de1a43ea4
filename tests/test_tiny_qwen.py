"""The offline Qwen tokenizer and tiny Qwen3 configs that the Qwen-based families build on."""
from __future__ import annotations

import pytest

from trainer_backend.families.tiny_qwen import (ADDED_TOKENS, IM_END, IM_START, build_qwen_tokenizer,
                                                qwen_vocab_size, special_token_id, tiny_qwen3_config)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_qwen_tokenizer(tmp_path_factory.mktemp("qwen-tok"), model_max_length=64)


@pytest.mark.parametrize("loader", ["Qwen2Tokenizer", "AutoTokenizer"])
def test_loads_offline_and_renders_the_qwen3_chat_template(folder, loader):
    import transformers
    tok = getattr(transformers, loader).from_pretrained(str(folder), local_files_only=True)
    text = tok.apply_chat_template([{"role": "user", "content": "a photo of a cat, 猫"}], tokenize=False,
                                   add_generation_prompt=True, enable_thinking=True)
    assert text == "<|im_start|>user\na photo of a cat, 猫<|im_end|>\n<|im_start|>assistant\n"
    no_think = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    ids = tok(text).input_ids
    assert ids[0] == special_token_id(IM_START) and ids.count(special_token_id(IM_END)) == 1
    assert tok.decode(ids) == text  # byte-level: any text round-trips, Chinese included
    assert tok.pad_token_id == tok.eos_token_id == special_token_id("<|endoftext|>")
    assert tok.model_max_length == 64
    assert len(tok) == qwen_vocab_size()
    # common caption words are single tokens, as in a real BPE vocabulary
    assert len(tok(" cat").input_ids) == 1


def test_tokenizer_json_agrees_with_vocab_and_merges(folder):
    from tokenizers import Tokenizer
    from transformers import Qwen2Tokenizer
    text = "<|im_start|>user\nred dog on the beach<|im_end|>\n"
    slow = Qwen2Tokenizer.from_pretrained(str(folder))(text).input_ids
    assert Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids == slow


def test_tiny_qwen3_covers_every_id(folder):
    import torch
    from transformers import Qwen2Tokenizer, Qwen3Model
    cfg = tiny_qwen3_config(hidden_size=32, num_hidden_layers=2)
    assert cfg.vocab_size == qwen_vocab_size() == special_token_id(ADDED_TOKENS[-1][0]) + 1
    tok = Qwen2Tokenizer.from_pretrained(str(folder))
    batch = tok(["a cat", "<think>"], padding="max_length", max_length=8, return_tensors="pt")
    out = Qwen3Model(cfg)(**batch, output_hidden_states=True)
    assert out.last_hidden_state.shape == (2, 8, 32) and len(out.hidden_states) == 3
    assert torch.isfinite(out.last_hidden_state).all()
