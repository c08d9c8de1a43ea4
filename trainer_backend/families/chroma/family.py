"""Chroma (Chroma1-HD, Chroma1-Base) behind the family contract, as a Flux.1 variant: the same
double/single-block transformer on 2×2-packed 16-channel latents and FLUX.1's autoencoder, but
conditioned on T5-XXL alone (no CLIP, no pooled embedding), with the T5 padding masked and no
guidance input: a small MLP (the "distilled guidance layer", or approximator) computes every
block's modulation from the timestep. Everything else (objective, packing, sampling pipeline
construction, LoRA layouts, the original-layout single file) is the Flux family's code."""
from __future__ import annotations

from pathlib import Path

from ...errors import ConfigError
from ..flow_common import FlowFamily, device_of as _device
from ..flux.family import FluxFamily

MAX_SEQUENCE_LENGTH = 512  # ChromaPipeline's default max_sequence_length


class ChromaFamily(FluxFamily):
    name = "chroma"
    label = "Chroma (Chroma1-HD, Chroma1-Base)"
    text_encoder_names = ("text_encoder",)  # T5-XXL
    trained_text_encoders = ()              # stays frozen, as in Flux
    text_encoder_file_options = ()
    keep_unquantized = (*FlowFamily.keep_unquantized, "distilled_guidance_layer")  # the modulation MLP
    block_patterns = ((r"^transformer_blocks\.(\d+)\.", "double_{0:02d}"),
                      (r"^single_transformer_blocks\.(\d+)\.", "single_{0:02d}"),
                      (r"^(?:pos_embed|x_embedder|context_embedder|distilled_guidance_layer)\.", "BASE"),
                      FlowFamily.BASE_AND_END[1])
    base_model_version = "chroma"
    network_module = "networks.lora_flux"   # kohya trains Chroma with its Flux network
    modelspec_implementation = "https://huggingface.co/lodestones/Chroma"
    modelspec_architecture = "chroma"
    short_label = "Chroma"
    pipelines = ("ChromaPipeline", "ChromaImg2ImgPipeline", "ChromaInpaintPipeline")
    transformer_class = "ChromaTransformer2DModel"
    configs = "chroma"

    def architecture(self, model) -> str:
        return self.modelspec_architecture   # one variant (Flux's -dev/-schnell rule does not apply)

    def detect_file(self, shapes, metadata) -> bool:
        return any(k.endswith("distilled_guidance_layer.in_proj.weight") for k in shapes)

    def load(self, src: Path, *, vae: str = "", prediction_type: str = "auto", tokenizer: str = "",
             text_encoder_files: dict[str, str] | None = None):
        if not src.is_dir():
            raise ConfigError(f"model.path: {src} is a Chroma single file; Chroma trains from a diffusers folder "
                              "(e.g. lodestones/Chroma1-HD) for now")
        model = FlowFamily.load(self, src, vae=vae, prediction_type=prediction_type, tokenizer=tokenizer)
        keep_mask_when_checkpointing(model.denoiser)
        return model

    def build_tiny(self, out_dir, seed: int = 0, **options) -> Path:
        from .tiny import build_tiny_chroma
        return build_tiny_chroma(out_dir, seed=seed, **options)

    # ---- text: T5 alone, read with its padding masked (ChromaPipeline._get_t5_prompt_embeds)
    def t5_length(self, model) -> int:
        return min(model.text_max_length or MAX_SEQUENCE_LENGTH, model.tokenizers[0].model_max_length)

    def tokenize(self, model, captions, max_token_length):
        batch = model.tokenizers[0](list(captions), padding="max_length", max_length=self.t5_length(model),
                                    truncation=True, return_tensors="pt")
        return [batch.input_ids, batch.attention_mask]

    def encode_text(self, model, input_ids, encoders=None):
        t5 = (encoders or model.text_encoders)[0]
        ids, mask = input_ids[0].to(_device(t5)), input_ids[1].to(_device(t5))
        hidden = t5(ids, attention_mask=mask, output_hidden_states=False)[0]
        return {"hidden": hidden, "mask": mask.to(hidden.dtype)}

    # ---- the forward call
    def conditioning(self, denoiser, text, image_tokens: int, device, dtype, cfg=None) -> dict:
        """The attention mask ChromaPipeline gives the transformer: the caption's tokens and the first
        padding token visible, the rest of the padding masked, then every image token. Built and typed
        as the pipeline builds it (a 0/1 tensor in the compute dtype, which diffusers' attention takes as
        an additive bias), so the trained model sees at sampling time exactly what it was trained on."""
        import torch
        tokens = text["mask"].to(device)
        visible = torch.arange(tokens.shape[1], device=device)[None, :] <= tokens.sum(dim=1, keepdim=True)
        image = torch.ones(tokens.shape[0], image_tokens, device=device, dtype=torch.bool)
        return {"attention_mask": torch.cat([visible, image], dim=1).to(dtype)}


def keep_mask_when_checkpointing(transformer) -> None:
    """diffusers 0.42's ChromaTransformer2DModel calls its single blocks without the attention mask when
    gradient checkpointing is on (`block(hidden_states, temb, image_rotary_emb)`), so
    precision.gradient_checkpointing would train on unmasked T5 padding. Hooks hand those calls the mask
    the transformer itself was called with (also when the block is recomputed in the backward pass,
    which runs before the next forward). The holder is shared by deep copies of the transformer."""
    holder: dict = {}

    def remember(_module, _args, kwargs):
        holder["mask"] = kwargs.get("attention_mask")

    def supply(_block, args, kwargs):
        if len(args) == 3 and "attention_mask" not in kwargs:  # the checkpointed call's positional form
            return args, {**kwargs, "attention_mask": holder.get("mask")}
        return None

    transformer.register_forward_pre_hook(remember, with_kwargs=True)
    for block in transformer.single_transformer_blocks:
        block.register_forward_pre_hook(supply, with_kwargs=True)


CHROMA = ChromaFamily()
