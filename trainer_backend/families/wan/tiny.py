"""A tiny random Wan 2.2 T2V pipeline with both experts, built offline in seconds for tests: a two-layer
UMT5 encoder with the local T5-style tokenizer (families/tiny_t5.py), a tiny causal 3D AutoencoderKLWan
(8x spatial, 4x temporal compression, as the real one: 9 frames -> 3 latent frames), two two-block
WanTransformer3DModel experts (`transformer` high noise, `transformer_2` low noise) split at
`boundary_ratio`, and the flow-matching Euler scheduler. 9 frames of 32x32 are 3x4x4 latents."""
from __future__ import annotations

from pathlib import Path

Z_DIM = 4
BOUNDARY_RATIO = 0.875   # Wan 2.2 T2V-A14B's own split


def tiny_components(seed: int = 0, experts: int = 2, layers: int = 2) -> dict:
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel
    from ..tiny_t5 import t5_vocab_size
    torch.manual_seed(seed)
    text = UMT5EncoderModel(UMT5Config(vocab_size=t5_vocab_size(), d_model=32, d_kv=8, d_ff=64, num_layers=2,
                                       num_heads=4, relative_attention_num_buckets=8, pad_token_id=0, eos_token_id=1,
                                       decoder_start_token_id=0))
    vae = AutoencoderKLWan(base_dim=8, z_dim=Z_DIM, dim_mult=[1, 1, 1, 1], num_res_blocks=1, attn_scales=[],
                           temperal_downsample=[False, True, True],
                           latents_mean=[0.0] * Z_DIM, latents_std=[1.0] * Z_DIM)

    def transformer():
        return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8,
                                     in_channels=Z_DIM, out_channels=Z_DIM, text_dim=32, freq_dim=32, ffn_dim=32,
                                     num_layers=layers, rope_max_seq_len=32)
    parts = dict(text_encoder=text.eval(), vae=vae.eval(), transformer=transformer(),
                 scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    if experts == 2:
        parts.update(transformer_2=transformer(), boundary_ratio=BOUNDARY_RATIO)
    return parts


def build_tiny_wan(out_dir: str | Path, seed: int = 0, experts: int = 2, layers: int = 2) -> Path:
    """Writes a WanPipeline folder (`WanPipeline.from_pretrained(out_dir)` loads it); `layers`: blocks per expert."""
    from diffusers import WanPipeline
    from transformers import AutoTokenizer
    from ..tiny_t5 import write_t5_tokenizer
    out = Path(out_dir)
    tok_dir = write_t5_tokenizer(out / "tokenizer", model_max_length=64)
    pipe = WanPipeline(tokenizer=AutoTokenizer.from_pretrained(tok_dir), **tiny_components(seed, experts, layers))
    pipe.save_pretrained(out)
    return out
