"""Krea 2's transformer as one file in the original checkpoint's layout (what ComfyUI and Krea's own
code load: `blocks.N.attn.wq`, `blocks.N.mod.lin` flattened, `first`, `last`, `txtfusion`, …): the
inverse of diffusers' convert_krea2_transformer_checkpoint_to_diffusers, which reads it back (the
conformance suite's full fine-tune check loads the file through it)."""
from __future__ import annotations

from pathlib import Path

# diffusers' names -> the original's (the converter's tables read backwards)
PREFIXES = (("img_in.", "first."), ("time_embed.linear_1.", "tmlp.0."), ("time_embed.linear_2.", "tmlp.2."),
            ("time_mod_proj.", "tproj.1."), ("txt_in.norm.weight", "txtmlp.0.scale"),
            ("txt_in.linear_1.", "txtmlp.1."), ("txt_in.linear_2.", "txtmlp.3."), ("text_fusion.", "txtfusion."),
            ("transformer_blocks.", "blocks."), ("final_layer.linear.", "last.linear."),
            ("final_layer.norm.weight", "last.norm.scale"), ("final_layer.scale_shift_table", "last.modulation.lin"))
BLOCK_NAMES = ((".attn.to_q.", ".attn.wq."), (".attn.to_k.", ".attn.wk."), (".attn.to_v.", ".attn.wv."),
               (".attn.to_out.0.", ".attn.wo."), (".attn.to_gate.", ".attn.gate."),
               (".attn.norm_q.weight", ".attn.qknorm.qnorm.scale"), (".attn.norm_k.weight", ".attn.qknorm.knorm.scale"),
               (".ff.", ".mlp."), (".norm1.weight", ".prenorm.scale"), (".norm2.weight", ".postnorm.scale"),
               (".scale_shift_table", ".mod.lin"))


def to_original(state: dict) -> dict:
    out = {}
    for key, value in state.items():
        name = key
        for new, old in PREFIXES:
            if name.startswith(new):
                name = old + name[len(new):]
                break
        if name.startswith("blocks.") and name.endswith(".scale_shift_table"):
            value = value.reshape(-1)  # the original keeps a block's six modulation vectors flattened
        if not name.startswith("last."):
            for new, old in BLOCK_NAMES:
                name = name.replace(new, old)
        out[name] = value
    return out


def to_diffusers(state: dict) -> dict:
    from diffusers.loaders.single_file_utils import convert_krea2_transformer_checkpoint_to_diffusers
    return convert_krea2_transformer_checkpoint_to_diffusers(dict(state))


def export_transformer(transformer, out_file, dtype=None, metadata: dict[str, str] | None = None) -> Path:
    from ..component_files import save_transformer_file
    return save_transformer_file(transformer, out_file, to_original, dtype, metadata)


def load_transformer_file(path, like):
    """A copy of the transformer `like` with the weights of a single file (through diffusers' converter)."""
    from ..component_files import transformer_from_file
    return transformer_from_file(path, like, to_diffusers)
