"""Weights from a PyTorch ``state_dict`` saved with safetensors, copied into an existing model by name.

NeuroFlow's parameters follow PyTorch's names and shapes (``0.weight`` is a
Linear's (out, in) weight, ``conv.weight`` a Conv2d's (out, in/groups, kh, kw)),
so ``safetensors.torch.save_file(model.state_dict(), path)`` on the PyTorch
side is all the export there is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from neuroflow.checkpoint import container
from neuroflow.checkpoint.container import FLOAT_CODES
from neuroflow.checkpoint.errors import CheckpointError, few, printable
from neuroflow.operator import Operator

#: PyTorch bookkeeping with no NeuroFlow counterpart; skipped rather than reported as unexpected.
TORCH_ONLY_SUFFIXES = (".num_batches_tracked",)


@dataclass(frozen=True)
class LoadedKeys:
    """Which names were copied, which model tensors the file lacked, and which file tensors were not used."""

    loaded: tuple[str, ...]
    missing: tuple[str, ...]
    unexpected: tuple[str, ...]
    skipped: tuple[str, ...]


def load_state_dict_file(
    model: Operator, path: str | os.PathLike[str], *, strict: bool = True, strip_prefix: str = ""
) -> LoadedKeys:
    """Copy the tensors of the safetensors file at ``path`` into ``model``'s parameters and buffers by name.

    ``strip_prefix`` removes a leading prefix from the file's names
    (``"module."`` from a DataParallel model). Float tensors (F16, BF16, F32,
    F64) are converted to the parameter's dtype; shapes must match exactly.
    With ``strict`` (the default) every model tensor must be in the file and
    every file tensor in the model; otherwise the mismatches are only reported.
    Everything is checked before any tensor is read, so a refused file leaves
    the model untouched.

    >>> keys = nf.checkpoint.load_state_dict_file(model, "torch_mlp.safetensors")
    """
    header = container.read_header(path)
    source = str(header.path)
    own = dict(model.named_parameters())
    own.update(model.named_buffers())
    by_name: dict[str, container.TensorEntry] = {}
    skipped = []
    for stored_name, entry in header.tensors.items():
        name = stored_name[len(strip_prefix):] if strip_prefix and stored_name.startswith(strip_prefix) else stored_name
        if name.endswith(TORCH_ONLY_SUFFIXES) and name not in own:
            skipped.append(stored_name)
            continue
        by_name[name] = entry
    missing = tuple(sorted(set(own) - set(by_name)))
    unexpected = tuple(sorted(set(by_name) - set(own)))
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"{source} does not match the model: missing {few(missing)}; unexpected {few(unexpected)} "
            "(pass strict=False to load the names that match, strip_prefix=... to drop a name prefix)"
        )
    matched = [name for name in own if name in by_name]
    for name in matched:
        entry, tensor = by_name[name], own[name]
        if entry.shape != tensor.shape:
            raise CheckpointError(
                f"{source}: {printable(entry.name)} has shape {entry.shape}; the model's {name} is {tensor.shape}"
            )
        if (entry.code in FLOAT_CODES) != (tensor.data.dtype.kind == "f"):
            raise CheckpointError(
                f"{source}: {printable(entry.name)} is {entry.code}; the model's {name} is {tensor.data.dtype}"
            )
    backend = model.backend
    with container.open_regular(header.path) as handle:
        for name in matched:
            entry, tensor = by_name[name], own[name]
            value = container.read_array(handle, entry)
            if entry.code == "BF16":
                value = container.widen_bfloat16(value)
            tensor.data[...] = backend.from_host(value.astype(tensor.data.dtype, copy=False))
    return LoadedKeys(tuple(matched), missing, unexpected, tuple(skipped))
