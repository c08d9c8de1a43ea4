"""Full-size Wan 2.2 transformer configs (as the Wan-AI diffusers repos ship them), for the meta-device
key checks and the memory planner: no weights, no download."""
from __future__ import annotations

_COMMON = dict(patch_size=[1, 2, 2], attention_head_dim=128, text_dim=4096, freq_dim=256, cross_attn_norm=True,
               qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
TRANSFORMERS = {
    # T2V-A14B: two experts of this shape (transformer, transformer_2), boundary_ratio 0.875
    "t2v-a14b": dict(_COMMON, num_attention_heads=40, in_channels=16, out_channels=16, ffn_dim=13824, num_layers=40),
    # I2V-A14B: the first frame's latents and mask concatenated on the channels (16 + 4 + 16), boundary 0.9
    "i2v-a14b": dict(_COMMON, num_attention_heads=40, in_channels=36, out_channels=16, ffn_dim=13824, num_layers=40),
    # TI2V-5B: one transformer over the 48-channel Wan 2.2 VAE's latents
    "ti2v-5b": dict(_COMMON, num_attention_heads=24, in_channels=48, out_channels=48, ffn_dim=14336, num_layers=30),
}
BOUNDARY_RATIOS = {"t2v-a14b": 0.875, "i2v-a14b": 0.9, "ti2v-5b": None}


def meta_transformer(variant: str):
    """The full-size WanTransformer3DModel on the meta device."""
    import torch
    from diffusers import WanTransformer3DModel
    if variant not in TRANSFORMERS:
        raise ValueError(f"unknown Wan 2.2 variant {variant!r} (one of {', '.join(TRANSFORMERS)})")
    with torch.device("meta"):
        return WanTransformer3DModel.from_config(TRANSFORMERS[variant])
