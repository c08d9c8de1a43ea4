"""How tensors are computed: the device (CUDA/ROCm/MPS/XPU/CPU specifics live only in devices.py) and
low-bit weights (storage quantization and 8-bit matmuls on the frozen base). Imported by methods/, training/,
diffusion/ and the captioners; imports none of them."""
