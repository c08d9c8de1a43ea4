"""Reading LoRA files back into peft's layout (network.network_weights): diffusers' layout here,
kohya's layout in the family that writes it (families/sd/lora_keys.py `from_kohya`).

A reader returns `LoraWeights`: per pipeline component, peft adapter keys without the adapter
name (`<module>.lora_A.weight`, `<module>.lora_B.weight`, what `get_peft_model_state_dict`
gives), and per (component, module) the scale the file's update is applied with (alpha / rank;
1.0 where the layout folds alpha into lora_B, as diffusers' does)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError

KEY = "network.network_weights"


@dataclass
class LoraWeights:
    weights: dict[str, dict] = field(default_factory=dict)              # component -> peft key -> tensor
    scales: dict[tuple[str, str], float] = field(default_factory=dict)  # (component, module) -> alpha/rank
    layout: str = ""                                                    # for the log: kohya, diffusers, ...

    def add(self, component: str, module: str, part: str, tensor) -> None:
        """part: "lora_A" or "lora_B"."""
        self.weights.setdefault(component, {})[f"{module}.{part}.weight"] = tensor


def is_diffusers_layout(state: dict, components: tuple[str, ...]) -> bool:
    """`<component>.<module>.lora_A.weight` / `.lora_B.weight` (and optional `.alpha`) keys only."""
    return bool(state) and all(
        k.split(".", 1)[0] in components and k.endswith((".lora_A.weight", ".lora_B.weight", ".alpha"))
        for k in state)


def read_diffusers_layout(state: dict, modules: dict, layout: str = "diffusers") -> LoraWeights:
    """A diffusers-layout state dict -> LoraWeights. `modules`: component -> the module the adapters go
    on; transformers 4's `text_model.` prefix is dropped where the module has none (transformers 5)."""
    out = LoraWeights(layout=layout)
    alphas = {}
    for key, tensor in state.items():
        component, rest = key.split(".", 1)
        if rest.startswith("text_model.") and not hasattr(modules.get(component), "text_model"):
            rest = rest[len("text_model."):]
        if rest.endswith(".alpha"):
            alphas[(component, rest[:-len(".alpha")])] = float(tensor)
            continue
        module, part = rest[:-len(".weight")].rsplit(".", 1)
        out.add(component, module, part, tensor)
    for component, weights in out.weights.items():
        for key, tensor in weights.items():
            if key.endswith(".lora_A.weight"):
                module = key[:-len(".lora_A.weight")]
                alpha = alphas.get((component, module))
                out.scales[(component, module)] = 1.0 if alpha is None else alpha / tensor.shape[0]
    return out


def read_with_diffusers(pipeline_class, state: dict, modules: dict, what: str) -> LoraWeights:
    """Layouts diffusers' own converters read (kohya's Flux layout, …): converted, then read as
    diffusers' layout (its converters fold alpha into the weights)."""
    try:
        converted = pipeline_class.lora_state_dict(dict(state))
    except Exception as e:  # diffusers' converters raise a variety of errors on files they do not know
        why = (str(e).strip().splitlines() or [""])[0][:200]
        raise ConfigError(f"{KEY}: not a LoRA file this {what} model can start from (diffusers' converter: "
                          f"{type(e).__name__}{': ' + why if why else ''})") from None
    converted = converted[0] if isinstance(converted, tuple) else converted
    if not is_diffusers_layout(converted, tuple(modules)):
        raise ConfigError(f"{KEY}: not a LoRA file this {what} model can start from (keys such as "
                          f"{next(iter(state), '(none)')})")
    return read_diffusers_layout(converted, modules, layout="converted by diffusers")
