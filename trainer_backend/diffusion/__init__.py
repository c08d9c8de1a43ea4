"""What a diffusion training step and its evaluation compute, for any family and any method: the loss,
sampling, validation loss and the adapter-effect check. Below both `methods/` and `training/`, so neither
imports the other's internals (training -> methods -> diffusion, never back)."""
