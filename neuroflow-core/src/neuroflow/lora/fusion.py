"""fuse / unfuse: merge trained LoRA adapters into their base weights, and take them out again."""

from __future__ import annotations

from typing import Any

from neuroflow.lora.adapter import LoRAAdapter, LoRAError
from neuroflow.lora.apply import named_layers, refuse_quantized, replace_child
from neuroflow.operator import Operator
from neuroflow.tensor import Tensor

#: The attribute of a fused layer that keeps its adapter, for unfuse (not a parameter, not a child).
FUSED_FROM = "_lora_fused_from"


def _add_into(weight: Tensor, delta: Any, sign: float) -> None:
    """``weight += sign·delta`` in place, in delta's (float32 or wider) precision."""
    data = weight.data
    if data.dtype == delta.dtype:
        data += sign * delta
    else:  # a half-precision base: merge in float32, round once
        data[...] = (data.astype(delta.dtype) + sign * delta).astype(data.dtype)


def fuse(model: Operator) -> Operator:
    """Merge every adapter into its base, ``W += (alpha/rank)·B·A`` in float32, and put the plain layer back.

    The fused model has the original model's layers, parameter names and
    speed, and its base parameters are trainable again if they were before
    ``apply_lora``. Each fused layer keeps its adapter (not as a parameter) so
    :func:`unfuse` can take the update out again. Quantize after fusing,
    never before: a model loaded from an INT8 file is refused. Returns the
    model (the plain layer when the model itself was an adapter).
    """
    refuse_quantized(model, "fuse LoRA adapters")
    adapters = [(path, parent, name, op) for path, parent, name, op in named_layers(model)
                if isinstance(op, LoRAAdapter)]
    if not adapters:
        raise LoRAError("fuse: the model has no LoRA adapters (apply them with nf.lora.apply_lora)")
    for _, parent, name, adapter in adapters:
        base = adapter.base
        _add_into(adapter.base_weight, adapter.delta_weight(), 1.0)
        adapter.release_base()
        object.__setattr__(base, FUSED_FROM, adapter)
        if parent is None:
            return base
        replace_child(parent, name, adapter, base)
    return model


def unfuse(model: Operator) -> Operator:
    """Undo :func:`fuse`: subtract each adapter's update from its base weight and put the adapter back.

    The base weights come back to within float rounding of what they were
    (one rounding of ``W + ΔW`` and one of ``… − ΔW``). Returns the model
    (the adapter when the model itself was a fused layer).
    """
    fused = [(path, parent, name, op) for path, parent, name, op in named_layers(model)
             if isinstance(getattr(op, FUSED_FROM, None), LoRAAdapter)]
    if not fused:
        raise LoRAError("unfuse: the model has no fused LoRA layers (nf.lora.fuse makes them)")
    for _, parent, name, base in fused:
        adapter: LoRAAdapter = getattr(base, FUSED_FROM)
        adapter.follow_base()
        _add_into(adapter.base_weight, adapter.delta_weight(), -1.0)
        adapter.freeze_base()
        object.__delattr__(base, FUSED_FROM)
        if parent is None:
            return adapter
        replace_child(parent, name, base, adapter)
    return model

