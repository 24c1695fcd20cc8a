"""apply_lora: replace chosen layers of a model by LoRA adapters, in place."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from neuroflow import registry
from neuroflow.checkpoint.model_file import quantization_of
from neuroflow.lora.adapter import ADAPTERS, LoRAAdapter, LoRAError
from neuroflow.operator import Operator

Targets = Iterable[str] | str | Callable[[str, Operator], bool]


def named_layers(model: Operator) -> Iterator[tuple[str, Operator | None, str, Operator]]:
    """``(path, parent, attribute, op)`` for every op under ``model``, parents first; adapters are not entered.

    The root has path ``""`` and no parent.
    """
    stack: list[tuple[str, Operator | None, str, Operator]] = [("", None, "", model)]
    while stack:
        path, parent, name, op = stack.pop()
        yield path, parent, name, op
        if isinstance(op, LoRAAdapter):
            continue
        children = [(f"{path}.{child_name}" if path else child_name, op, child_name, child)
                    for child_name, child in op.named_children()]
        stack.extend(reversed(children))


def replace_child(parent: Operator, name: str, old: Operator, new: Operator) -> None:
    """Put ``new`` where ``old`` was: the attribute (a registered child) and any list that holds it (Sequential.layers)."""
    setattr(parent, name, new)
    for value in vars(parent).values():
        if isinstance(value, list):
            for i, item in enumerate(value):
                if item is old:
                    value[i] = new


def refuse_quantized(model: Operator, action: str) -> None:
    """Raise LoRAError when ``model``'s weights came from a quantized file: merging into them compounds the error."""
    scheme = quantization_of(model)
    if scheme is not None:
        raise LoRAError(
            f"cannot {action}: this model was loaded from an {scheme.upper()} file, so its weights carry the "
            "quantization error. Quantize after fusing, never before: apply LoRA to the float model, train, "
            "nf.lora.fuse(model), then nf.save(model, path, quantize='int8')"
        )


def describe(path: str, op: Operator) -> str:
    return f"{path or '(the model itself)'} ({op!r})"


def _candidates(layers: list[tuple[str, Operator | None, str, Operator]]) -> str:
    found = [describe(path, op) for path, _, _, op in layers if adapter_class(op) is not None]
    if len(found) > 24:
        found = [*found[:24], f"… {len(found) - 24} more"]
    return ", ".join(found) or "none"


def adapter_class(op: Operator) -> type[LoRAAdapter] | None:
    """The adapter class that can wrap ``op``, or None."""
    if isinstance(op, LoRAAdapter):
        return None
    for cls in ADAPTERS:
        if cls.refuses(op) is None:
            return cls
    return None


def _select(model: Operator, targets: Targets) -> list[tuple[str, Operator | None, str, Operator]]:
    layers = list(named_layers(model))
    if callable(targets):
        return [layer for layer in layers if targets(layer[0], layer[3])]
    names = [targets] if isinstance(targets, str) else list(targets)
    if not names or not all(isinstance(n, str) for n in names):
        raise LoRAError(f"targets must be op type names or layer paths (strings), or a callable; got {targets!r}")
    by_path = {path: layer for layer in layers if (path := layer[0])}
    types = sorted({type(op).__name__ for _, _, _, op in layers})
    chosen: set[int] = set()
    for name in names:
        if name in by_path:
            chosen.add(id(by_path[name][3]))
        elif name in types:
            chosen.update(id(op) for _, _, _, op in layers if type(op).__name__ == name)
        elif name not in registry.ops.names():
            raise LoRAError(
                f"LoRA target {name!r} is neither a layer path nor an op type of this model; "
                f"op types in the model: {', '.join(types)}; layers that can take an adapter: {_candidates(layers)}"
            )
    return [layer for layer in layers if id(layer[3]) in chosen]


def apply_lora(
    model: Operator,
    rank: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
    targets: Targets = ("Linear",),
) -> Operator:
    """Replace the chosen layers of ``model`` by LoRA adapters (in place) and return the model.

    ``targets`` chooses the layers: op type names (``("Linear", "Conv2d")``,
    matched exactly, so DepthwiseConv2d is not a Conv2d here), dotted layer
    paths as ``named_parameters`` prints them (``["0", "4"]``), or a callable
    ``(path, op) -> bool``. Each chosen layer's weight and bias are frozen;
    only the adapters' ``lora_A``/``lora_B`` train. The adapted model computes
    exactly what it did before until ``lora_B`` moves off zero. When the model
    itself is the chosen layer, the adapter is returned in its place.

    Example::

        model = nf.load("mnist_mlp.safetensors")
        model = nf.lora.apply_lora(model, rank=8, alpha=16, targets=("Linear",))
        nf.Trainer(model, ...).fit(nf.data.fashion_mnist("train"))
        nf.lora.fuse(model)          # then nf.save(model, path, quantize="int8") if wanted
    """
    if not isinstance(model, Operator):
        raise TypeError(f"apply_lora needs an Operator model; got {type(model).__name__}")
    refuse_quantized(model, "apply LoRA")
    chosen = _select(model, targets)
    if not chosen:
        raise LoRAError(
            f"no layer matched targets={targets!r}; layers that can take an adapter: "
            f"{_candidates(list(named_layers(model)))}"
        )
    plan = []
    for path, parent, name, op in chosen:
        if isinstance(op, LoRAAdapter):
            raise LoRAError(f"layer {describe(path, op)} already has a LoRA adapter; fuse or unfuse it first")
        cls = adapter_class(op)
        if cls is None:
            reasons = "; ".join(f"{c.__name__}: {c.refuses(op)}" for c in ADAPTERS)
            raise LoRAError(f"layer {describe(path, op)} cannot take a LoRA adapter ({reasons})")
        plan.append((parent, name, op, cls))
    for parent, name, op, cls in plan:  # every layer checked before the model is changed
        adapter = cls(op, rank=rank, alpha=alpha, dropout=dropout)
        if parent is None:
            return adapter
        replace_child(parent, name, op, adapter)
    return model


def mark_only_lora_as_trainable(model: Operator) -> list[str]:
    """Freeze every parameter of ``model`` but the adapters' ``lora_A``/``lora_B``; returns the names frozen.

    apply_lora freezes only the layers it adapts; this freezes the rest too
    (BatchNorm, untargeted layers), as PEFT does, so that only the adapters
    get gradient buffers and optimizer state.
    """
    adapters = [op for _, _, _, op in named_layers(model) if isinstance(op, LoRAAdapter)]
    if not adapters:
        raise LoRAError("the model has no LoRA adapters to train; apply them first with nf.lora.apply_lora(model)")
    keep = {id(t) for a in adapters for t in (a.lora_A, a.lora_B)}
    frozen = []
    for name, p in model.named_parameters():
        if id(p) not in keep and p.requires_grad:
            p.requires_grad = False
            p.grad = None
            frozen.append(name)
    return frozen
