"""A tiny random LTX-2 pipeline (video + audio), built offline in seconds for tests: a two-layer Gemma 3
(a one-layer vision tower it does not use) with the local T5-style tokenizer (families/tiny_t5.py),
one-layer text connectors, a three-block LTX-2 video VAE (8x spatial, 8x temporal) and a one-block audio VAE, a small vocoder, and a two-block
LTX2VideoTransformer3DModel with its audio stream. 9 frames of 32x32 run in a few seconds on CPU."""
from __future__ import annotations

from pathlib import Path


def tiny_components(seed: int = 0) -> dict:
    import torch
    from diffusers import AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, \
        LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration
    from ..tiny_t5 import t5_vocab_size
    torch.manual_seed(seed)
    # the connectors' width (heads x head_dim) must equal the text encoder's hidden size
    text = dict(vocab_size=t5_vocab_size(), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=128, sliding_window=64)
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    encoder = Gemma3ForConditionalGeneration(config).eval()
    width = config.text_config.hidden_size
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
        caption_channels=width, rope_double_precision=False, rope_type="split")
    connectors = LTX2TextConnectors(
        caption_channels=width, text_proj_in_factor=config.text_config.num_hidden_layers + 1,
        video_connector_num_attention_heads=4, video_connector_attention_head_dim=8, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=8, audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32, rope_double_precision=False, rope_type="split")
    # LTX-2's frame rule (8x temporal compression: 9 frames -> 2 latent frames) at 8x spatial: 32 px -> 4x4
    vae = AutoencoderKLLTX2Video(
        latent_channels=4, block_out_channels=(8, 8, 8), decoder_block_out_channels=(8, 8, 8),
        layers_per_block=(1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True), decoder_spatio_temporal_scaling=(True, True, True),
        decoder_inject_noise=(False,) * 4, downsample_type=("spatiotemporal",) * 3,
        upsample_type=("spatiotemporal",) * 3, upsample_residual=(False,) * 3, upsample_factor=(1, 1, 1),
        patch_size=1, patch_size_t=1, decoder_causal=False)
    # three levels: the 4x time and mel compression LTX2Pipeline assumes (8 mel bins -> 2, 4 time steps -> 1)
    audio_vae = AutoencoderKLLTX2Audio(base_channels=4, output_channels=2, ch_mult=(1, 1, 1), num_res_blocks=1,
                                       resolution=32, latent_channels=2, mel_bins=8)
    vocoder = LTX2Vocoder(in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
                          upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
                          output_sampling_rate=16000)
    # LTX-2's resolution-dependent shift (its scheduler config; LTX2Pipeline computes mu from the video tokens)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                                                base_image_seq_len=1024, max_image_seq_len=4096)
    return dict(scheduler=scheduler, vae=vae, audio_vae=audio_vae, text_encoder=encoder,
                connectors=connectors, transformer=transformer, vocoder=vocoder)


def build_tiny_ltx2(out_dir: str | Path, seed: int = 0) -> Path:
    """Writes an LTX2Pipeline folder (`LTX2Pipeline.from_pretrained(out_dir)` loads it)."""
    from diffusers import LTX2Pipeline
    from transformers import AutoTokenizer
    from ..tiny_t5 import write_t5_tokenizer
    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(write_t5_tokenizer(out / "tokenizer", model_max_length=64))
    LTX2Pipeline(tokenizer=tokenizer, **tiny_components(seed)).save_pretrained(out)
    return out
