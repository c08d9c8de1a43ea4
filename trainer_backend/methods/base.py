"""What every training method hands the loop: the modules with trainable parameters, their
parameter groups, and how their trainable state goes into and out of a checkpoint."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

@dataclass
class Trainable:
    """The modules that hold trainable parameters, keyed by pipeline component name.

    kind "adapter": peft adapters on frozen modules (checkpoints hold only the adapter weights);
    kind "full": the modules themselves are trained (checkpoints hold their whole state);
    kind "vae": the autoencoder (or its decoder) is trained, checkpointed like "full".
    """
    modules: dict[str, torch.nn.Module]
    param_groups: list[dict] = field(default_factory=list)
    kind: Literal["adapter", "full", "vae"] = "adapter"
    param_dtype: torch.dtype = torch.float32  # bf16/fp16 with precision.full_bf16/full_fp16

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for g in self.param_groups for p in g["params"]]

    def named_parameters(self) -> dict[str, torch.nn.Parameter]:
        """Trainable parameters as "<component>.<parameter name>" (stable across runs: EMA keys)."""
        return {f"{name}.{pname}": p for name, module in self.modules.items()
                for pname, p in module.named_parameters() if p.requires_grad}

    def checkpoint_file(self, name: str) -> str:
        return f"adapter_{name}.safetensors" if self.kind == "adapter" else f"full_{name}.safetensors"

    def state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """What a checkpoint stores for component `name` (contiguous, as safetensors wants)."""
        module = self.modules[name]
        if self.kind == "adapter":
            from peft.utils import get_peft_model_state_dict
            state = get_peft_model_state_dict(module)
        else:
            state = module.state_dict()
        return {k: v.detach().contiguous() for k, v in state.items()}

    def load_state_dict(self, name: str, state: dict[str, torch.Tensor]) -> None:
        module = self.modules[name]
        if self.kind == "adapter":
            from peft.utils import set_peft_model_state_dict
            result = set_peft_model_state_dict(module, state)
            unexpected = getattr(result, "unexpected_keys", None)
            if unexpected:
                raise RuntimeError(f"checkpoint adapter for {name} does not match the configured network "
                                   f"(unexpected keys such as {unexpected[0]}); was network.* changed?")
        else:
            module.load_state_dict(state)
        for p in self.parameters():  # diffusers #6552: trainable params stay fp32 after a load
            p.data = p.data.to(self.param_dtype)  # (or the half dtype of precision.full_bf16/full_fp16)


def fp32_param_groups(modules: dict[str, torch.nn.Module], unet_lr: float, text_encoder_lr: float) -> list[dict]:
    """Trainable parameters per component, cast to fp32 master weights (the frozen base may be
    half precision), with the UNet's and the text encoders' learning rates."""
    groups = []
    for name, module in modules.items():
        params = [p for p in module.parameters() if p.requires_grad]
        for p in params:
            p.data = p.data.float()
        groups.append({"params": params, "lr": text_encoder_lr if name.startswith("text_encoder") else unet_lr, "name": name})
    return groups
