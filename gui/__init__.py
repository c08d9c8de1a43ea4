"""Gradio front end of the SD Training Studio (no torch/diffusers in this process)."""
