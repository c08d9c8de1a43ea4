"""precision.full_bf16 / full_fp16: the rules and the plan's warning (pure: no torch here, so the
GUI and the CLI `plan` can call it). The optimizers are in half_precision_optimizers.py; `keep_half_weights`
(torch) casts the trained weights once the method has made them trainable."""
from __future__ import annotations

from ..config import TrainConfig, rules
from ..config.hardware_rules import half_weights_dtype  # noqa: F401 (re-exported)

ROUNDED_OPTIMIZERS = ("adamw", "sgd")  # written out in half_precision_optimizers.py with the chosen rounding


def check_half_weights(cfg: TrainConfig) -> None:
    """ConfigError naming the key when the combination cannot work (config/hardware_rules.py)."""
    rules.check(cfg, "half_weights")


def check_precision_options(cfg: TrainConfig) -> None:
    """The half-precision rules, checked before a run starts (config/hardware_rules.py)."""
    rules.check(cfg, "half_weights", "precision")


def half_weights_warnings(cfg: TrainConfig) -> list[str]:
    """The plan's note about the trade-off (empty when off)."""
    kind = half_weights_dtype(cfg)
    if not kind:
        return []
    p, name = cfg.precision, cfg.optimizer.name
    bits = "8" if kind == "bf16" else "11"
    rounding = (f"updates are written with {p.half_weights_rounding} rounding"
                if name in ROUNDED_OPTIMIZERS and p.half_weights_rounding != "nearest" else
                f"optimizer {name!r} rounds updates to nearest, so updates below a weight's precision are lost "
                f"(adamw or sgd with precision.half_weights_rounding = stochastic avoid that)")
    what = "the trained weights" if cfg.network.type == "full" else "the adapter weights (small: little to gain)"
    return [f"precision.full_{kind}: {what} are kept in {kind} with no fp32 master copy: weights, gradients and "
            f"optimizer state take about half the memory, but each weight has only {bits} bits of precision; "
            f"{rounding}. Expect slightly noisier training than mixed precision; use it when a full fine-tune "
            f"does not fit otherwise."]


def keep_half_weights(trainable, cfg: TrainConfig, accelerator=None) -> None:
    """Cast the method's trainable parameters to the half dtype (after setup_method, before
    accelerator.prepare), make checkpoint loads keep that dtype, and let fp16's gradient scaler
    unscale fp16 gradients. A no-op when off."""
    kind = half_weights_dtype(cfg)
    if not kind:
        return
    import torch
    from .half_precision_optimizers import cast_trainable
    check_half_weights(cfg)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float16
    cast_trainable(trainable.parameters(), dtype)
    trainable.param_dtype = dtype  # methods/base.Trainable.load_state_dict casts to this after a load
    scaler = getattr(accelerator, "scaler", None)
    if scaler is not None:  # fp16: torch refuses to unscale fp16 gradients unless told it is intended
        unscale = scaler._unscale_grads_

        def unscale_allowing_fp16(optimizer, inv_scale, found_inf, allow_fp16):
            return unscale(optimizer, inv_scale, found_inf, True)
        scaler._unscale_grads_ = unscale_allowing_fp16
