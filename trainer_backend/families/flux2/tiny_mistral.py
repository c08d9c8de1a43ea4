"""An offline Mistral-style tokenizer for the tiny Flux.2 dev model, and a tiny Mistral-3 text encoder
config.

Flux.2 dev's text encoder is Mistral Small 3.x (`Mistral3ForConditionalGeneration`, a Pixtral vision
tower beside a Mistral text model) and its `tokenizer` slot holds a `PixtralProcessor` whose chat
template Flux2Pipeline renders. A PixtralProcessor cannot be built without torchvision (which this
project does not install: FIELD-NOTES), and for text alone it renders the template and tokenizes with
its tokenizer, so the tiny model's slot holds the tokenizer itself, chat template included; the family
loads a real folder's slot the same way (mistral_file.load_mistral_tokenizer). The real vocabulary (Tekken, ~131k tokens) cannot be downloaded here,
so the tiny model carries its own: Mistral's control tokens first, in Mistral's order (`<unk>`, `<s>`,
`</s>`, `[INST]`, ... `[IMG]` at id 10 as Mistral3Config's image_token_index, `[SYSTEM_PROMPT]`), then
the byte-level BPE of families/tiny_qwen.py (every byte a token, so any caption tokenizes). The chat
template renders text messages as Mistral Small 3.1's does:
``<s>[SYSTEM_PROMPT]…[/SYSTEM_PROMPT][INST]…[/INST]``.
"""
from __future__ import annotations

from pathlib import Path

# Mistral's (Tekken's) control tokens, ids 0.. in this order
SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
            "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]"]

# Text content as a string or as Flux2Pipeline's [{"type": "text", "text": ...}] lists
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['content'] is string -%}{%- set text = message['content'] -%}"
    "{%- else -%}{%- set text = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text')"
    " | join('') -%}{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{{- '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '[INST]' + text + '[/INST]' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- text + eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
)
PATCH_SIZE = 4  # the tiny Pixtral tower's patch (the real one: 14)


def vocab_size() -> int:
    from ..tiny_qwen import byte_level_vocab_and_merges
    return len(SPECIALS) + len(byte_level_vocab_and_merges()[0])


def build_mistral_tokenizer(folder: str | Path, model_max_length: int) -> Path:
    """Write the tokenizer (tokenizer.json, tokenizer_config.json, chat_template.jinja) into `folder`;
    AutoTokenizer.from_pretrained(folder) loads it offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from ..tiny_qwen import byte_level_vocab_and_merges

    bpe_vocab, merges = byte_level_vocab_and_merges()
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({tok: len(SPECIALS) + i for tok, i in bpe_vocab.items()})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>", pad_token="<pad>", model_max_length=model_max_length)
    tokenizer.chat_template = CHAT_TEMPLATE
    out = Path(folder)
    tokenizer.save_pretrained(str(out))
    return out


def tiny_mistral3_config(hidden_size: int = 32, num_hidden_layers: int = 31):
    """Mistral3ForConditionalGeneration with a one-layer Pixtral tower and a `hidden_size`-wide Mistral
    text model whose vocabulary covers build_mistral_processor's ids."""
    from transformers import Mistral3Config, MistralConfig, PixtralVisionConfig
    text = MistralConfig(vocab_size=vocab_size(), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=hidden_size // 2, max_position_embeddings=1024, rms_norm_eps=1e-5,
                         rope_theta=1e9, sliding_window=None, bos_token_id=1, eos_token_id=2, pad_token_id=11,
                         tie_word_embeddings=False)
    vision = PixtralVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 head_dim=8, patch_size=PATCH_SIZE, image_size=64)
    return Mistral3Config(vision_config=vision, text_config=text, image_token_index=SPECIALS.index("[IMG]"),
                          spatial_merge_size=2, tie_word_embeddings=False)
