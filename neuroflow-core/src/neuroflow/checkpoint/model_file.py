"""Model files: ``nf.save`` and ``nf.load``.

A model file is a safetensors file. Its tensors are the model's parameters and
buffers under their dotted names (``0.weight``), in float; a quantized file
holds weights as INT8 with ``name::scale`` per-channel scales and the other
float tensors as float16 (see :mod:`neuroflow.checkpoint.quantize`). Its
``__metadata__`` holds, as JSON strings:
``format`` and ``format_version``; ``topology`` (the op tree, see
:mod:`neuroflow.checkpoint.topology`); ``runtime`` (NeuroFlow version, dtype,
mode); ``quantization`` when quantized; ``user`` (the caller's metadata); and
``checksums``: a CRC-32 of the other metadata and one per tensor over its name,
dtype, shape and bytes, so a flipped bit anywhere is refused rather than loaded.
Nothing in the file is executed; loading rebuilds the model through the op registry.
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from neuroflow.backends.selection import get_backend
from neuroflow.checkpoint import container, topology
from neuroflow.checkpoint.checksums import ALGORITHM, metadata_checksum, tensor_checksum
from neuroflow.checkpoint.container import FLOAT_CODES, Header, TensorEntry
from neuroflow.checkpoint.errors import CheckpointError, few, printable
from neuroflow.checkpoint.quantize import SCHEME, QuantizationReport, quantize_weights, scale_name
from neuroflow.checkpoint.reading import Verification, open_file, read_weights
from neuroflow.operator import Operator
from neuroflow.tensor import Tensor
from neuroflow.version import __version__

if TYPE_CHECKING:
    from neuroflow.backends.base import Backend

MODEL_FORMAT = "neuroflow.model"
TRAINING_FORMAT = "neuroflow.training"
FORMAT_VERSION = 1
#: Tensors of a training checkpoint that are not the model's (``optimizer::exp_avg``).
OPTIMIZER_PREFIX = "optimizer::"
_FLOAT_DTYPES = {"float16", "float32", "float64"}
_MARKER = "_neuroflow_quantization"
_VERSION = re.compile(r"[0-9]{1,6}")


@dataclass(frozen=True)
class SaveReport:
    """What ``nf.save`` wrote: the file, its size, and the quantization error when quantized."""

    path: Path
    file_bytes: int
    tensors: int
    quantization: QuantizationReport | None = None

    def __str__(self) -> str:
        text = f"saved {self.path} ({self.file_bytes:,} bytes, {self.tensors} tensors)"
        return text if self.quantization is None else f"{text}\n{self.quantization}"


def quantization_of(model: Operator) -> str | None:
    """The scheme (``"int8"``) a model was dequantized from when loaded, or None for a float model."""
    return getattr(model, _MARKER, None)


# --------------------------------------------------------------------------- saving
def save(
    model: Operator,
    path: str | os.PathLike[str],
    quantize: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> SaveReport:
    """Write ``model`` (topology and weights) to ``path`` as a safetensors file, atomically.

    ``quantize="int8"`` stores weights as INT8 with per-output-channel scales
    and reports the round-trip error it measured; a model loaded from an INT8
    file is refused (its weights already carry that error). ``metadata`` is
    any JSON-able dict, kept under ``user`` in the file.

    >>> report = nf.save(model, "mlp.safetensors", quantize="int8")
    >>> print(report.quantization)
    """
    if not isinstance(model, Operator):
        raise TypeError(f"nf.save needs an Operator; got {type(model).__name__}")
    if quantize not in (None, SCHEME):
        raise CheckpointError(f"quantize must be None or {SCHEME!r}; got {quantize!r}")
    previous = quantization_of(model)
    if quantize is not None and previous is not None:
        raise CheckpointError(
            f"this model was loaded from an {previous.upper()} file and is already quantized; quantizing again "
            "would add its error twice. Save it with quantize=None, or quantize the original float model"
        )
    tensors, meta = model_payload(model, MODEL_FORMAT, metadata)
    report = None
    if quantize is not None:
        parameters = {name for name, _ in model.named_parameters()}
        tensors, scales, report = quantize_weights(tensors, parameters)
        meta["quantization"] = compact_json({"scheme": SCHEME, "weights": sorted(scales)})
    elif previous is not None:
        runtime = json.loads(meta["runtime"])
        meta["runtime"] = compact_json({**runtime, "quantized_from": previous})
    target = write_model_file(path, tensors, meta)
    return SaveReport(target, target.stat().st_size, len(tensors), report)


def model_payload(model: Operator, file_format: str, user: dict[str, Any] | None) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The model's host tensors by name and the metadata strings describing it (no checksums yet)."""
    try:
        user_json = compact_json(user if user is not None else {})
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"metadata must be JSON-able; {exc}") from None
    backend = model.backend
    tensors = {name: np.ascontiguousarray(backend.to_host(array)) for name, array in model.state_dict().items()}
    floats = {str(a.dtype) for a in tensors.values() if a.dtype.kind == "f"}
    if len(floats) > 1:
        raise CheckpointError(f"the model mixes float dtypes {sorted(floats)}; convert it to one with model.astype()")
    runtime = {
        "neuroflow": __version__, "dtype": floats.pop() if floats else "float32",
        "training": bool(model.training), "saved_on": backend.device,
    }
    meta = {
        "format": file_format, "format_version": str(FORMAT_VERSION),
        "topology": compact_json(topology.describe(model)), "runtime": compact_json(runtime), "user": user_json,
    }
    return tensors, meta


def write_model_file(path: str | os.PathLike[str], tensors: dict[str, np.ndarray], meta: dict[str, str]) -> Path:
    """Add the checksums to ``meta`` and write the file atomically."""
    sums = {name: tensor_checksum(name, container.dtype_code(a.dtype), a.shape, a) for name, a in tensors.items()}
    meta = {**meta, "checksums": compact_json({"algorithm": ALGORITHM, "metadata": metadata_checksum(meta),
                                                "tensors": sums})}
    return container.write(path, tensors, meta)


def compact_json(value: Any) -> str:
    """``value`` as JSON without optional spaces (the header of a small model is a real share of its file)."""
    return json.dumps(value, separators=(",", ":"))


# --------------------------------------------------------------------------- loading
@dataclass
class ModelFile:
    """A model file whose header, metadata and topology have been checked, ready to rebuild."""

    header: Header
    file_format: str
    topology: dict[str, Any]
    runtime: dict[str, Any]
    scales: dict[str, str]
    checksums: dict[str, int]
    user: dict[str, Any] = field(default_factory=dict)

    @property
    def optimizer_tensors(self) -> dict[str, str]:
        """Stored name → optimizer state name, for a training checkpoint (empty for a model file)."""
        if self.file_format != TRAINING_FORMAT:
            return {}
        prefix = OPTIMIZER_PREFIX
        return {name: name[len(prefix):] for name in self.header.tensors if name.startswith(prefix)}

    @property
    def source(self) -> str:
        return str(self.header.path)


def load(path: str | os.PathLike[str], device: str | Backend | None = None, mmap: bool = True) -> Operator:
    """Rebuild the model saved at ``path`` through the op registry and place it on ``device``.

    Everything is checked before anything large is allocated: the header
    against the file size, the format version, the checksums of the metadata,
    the topology (unknown ops name the distribution to install), the shape of
    every tensor against the rebuilt model; then the checksum of every tensor.
    INT8 weights are dequantized to the model's float dtype. The file is
    mapped copy-on-write, and a float model on the CPU views the mapping
    (``mmap=False`` reads it instead; see :mod:`neuroflow.checkpoint.reading`
    for what a mapping asks of the file). Raises CheckpointError for any
    problem with the file. The model comes back in the mode it was saved in
    (``model.training``): a model saved after ``fit`` is in training mode, so
    call ``model.eval()`` before ``model.forward`` for predictions (BatchNorm
    and Dropout then act as in evaluation; ``Trainer.predict`` does it
    itself, and ``neuroflow train`` saves its model in evaluation mode).

    >>> model = nf.load("mlp.safetensors", device="cpu")
    """
    backend = get_backend(device)
    header, content = open_file(path, mmap)
    opened = check_model_header(header)
    # The file's model tensors are exactly those of the rebuilt model (rebuild checks it): check them meanwhile.
    optimizer = opened.optimizer_tensors
    verification = Verification([e for name, e in header.tensors.items() if name not in optimizer], content, opened)
    try:
        model, tensors = rebuild(opened)
    except BaseException:
        verification.cancel()
        raise
    read_weights(tensors, opened, content, verification)
    if opened.scales:
        object.__setattr__(model, _MARKER, SCHEME)
    elif "quantized_from" in opened.runtime:
        object.__setattr__(model, _MARKER, str(opened.runtime["quantized_from"]))
    if backend.name != "cpu":  # a rebuilt model already lives on the host
        model.to(backend)
    return model


def open_model_file(path: str | os.PathLike[str], formats: tuple[str, ...] = (MODEL_FORMAT, TRAINING_FORMAT)) -> ModelFile:
    """Read and check a model file's header, metadata and topology; no tensor data is read."""
    return check_model_header(container.read_header(path), formats)


def check_model_header(header: Header, formats: tuple[str, ...] = (MODEL_FORMAT, TRAINING_FORMAT)) -> ModelFile:
    """Check the metadata and topology of a model file whose safetensors header has been read."""
    meta, source = header.metadata, str(header.path)
    file_format = meta.get("format")
    if file_format not in formats:
        hint = " (a PyTorch state_dict? use nf.checkpoint.load_state_dict_file)" if file_format is None else ""
        raise CheckpointError(f"{source}: format {file_format!r} is not one of {', '.join(formats)}{hint}")
    version = meta.get("format_version", "")
    if not _VERSION.fullmatch(version) or int(version) < 1:
        raise CheckpointError(f"{source}: format_version {version!r} is not a version number")
    if int(version) > FORMAT_VERSION:
        raise CheckpointError(
            f"{source} was written in format version {version} by a newer NeuroFlow; this one "
            f"({__version__}) reads up to version {FORMAT_VERSION}: pip install -U neuroflow-core"
        )
    checksums = _json(meta, "checksums", source)
    if checksums.get("metadata") != metadata_checksum(meta):
        raise CheckpointError(f"{source}: the metadata checksum does not match; the file is corrupt or was edited")
    tensor_sums = checksums.get("tensors")
    if not isinstance(tensor_sums, dict):
        raise CheckpointError(f"{source}: checksums lack the per-tensor table")
    runtime = _json(meta, "runtime", source)
    if runtime.get("dtype") not in _FLOAT_DTYPES:
        raise CheckpointError(f"{source}: runtime dtype {runtime.get('dtype')!r} is not one of {sorted(_FLOAT_DTYPES)}")
    scales: dict[str, str] = {}
    if "quantization" in meta:
        quantization = _json(meta, "quantization", source)
        weights = quantization.get("weights")
        if quantization.get("scheme") != SCHEME:
            raise CheckpointError(f"{source}: quantization scheme {quantization.get('scheme')!r} is unknown")
        if not isinstance(weights, list) or not all(isinstance(name, str) for name in weights):
            raise CheckpointError(f"{source}: quantization must list the quantized weights by name")
        scales = {name: scale_name(name) for name in weights}
    tree = topology.validate(_json(meta, "topology", source), source)
    user = _json(meta, "user", source) if "user" in meta else {}
    return ModelFile(header, str(file_format), tree, runtime, scales, tensor_sums, user)


def _json(meta: dict[str, str], key: str, source: str) -> dict[str, Any]:
    if key not in meta:
        raise CheckpointError(f"{source}: metadata lacks {key!r}")
    try:
        value = json.loads(meta[key])
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{source}: metadata {key!r} is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{source}: metadata {key!r} is a JSON {type(value).__name__}; expected an object")
    return value


def rebuild(opened: ModelFile) -> tuple[Operator, dict[str, Tensor]]:
    """The model of ``opened``'s topology and its parameters and buffers by name, checked against the file's tensors.

    The tensors still hold the rebuild's placeholders; :func:`read_weights` fills them.
    """
    model = topology.build(opened.topology, opened.source, opened.header.total_elements)
    tensors = check_tensors(model, opened)
    dtype = np.dtype(opened.runtime["dtype"])
    if any(t.data.dtype != dtype for t in tensors.values() if t.data.dtype.kind == "f"):
        model.astype(dtype)  # converts the same Tensor objects, so ``tensors`` stays the model's
    model.train(bool(opened.runtime.get("training", True)))
    return model, tensors


def check_tensors(model: Operator, opened: ModelFile) -> dict[str, Tensor]:
    """The model's parameters and buffers by name; raises unless the file holds exactly them (and optimizer state).

    Shapes must match, and a float tensor must be stored as a float (INT8 with scales when quantized).
    """
    source, stored = opened.source, opened.header.tensors
    own = dict(model.named_parameters())
    own.update(model.named_buffers())
    expected = set(own) | set(opened.scales.values()) | set(opened.optimizer_tensors)
    if expected != stored.keys() or not opened.scales.keys() <= own.keys():
        missing, unexpected = sorted(expected - set(stored)), sorted(set(stored) - expected)
        raise CheckpointError(
            f"{source}: the tensors do not match the model its topology describes: "
            f"missing {few(missing)}, unexpected {few(unexpected)}"
        )
    for name, tensor in own.items():
        entry = stored[name]
        if entry.shape != tensor.shape:
            raise CheckpointError(f"{source}: {name} has shape {entry.shape} in the file; the model needs {tensor.shape}")
        kind = tensor.data.dtype.kind
        if name in opened.scales:
            scale = stored[opened.scales[name]]
            if entry.code != "I8" or scale.code not in ("F16", "F32") or scale.shape != tensor.shape[:1]:
                raise CheckpointError(
                    f"{source}: quantized {name} must be I8 with F16 or F32 scales of shape {tensor.shape[:1]}; "
                    f"got {entry.code} and {scale.code} {scale.shape}"
                )
        elif (kind == "f") != (entry.code in FLOAT_CODES):
            raise CheckpointError(f"{source}: {name} is stored as {entry.code}; the model holds {tensor.data.dtype}")
    if not expected <= opened.checksums.keys():
        raise CheckpointError(f"{source}: no checksum recorded for {min(expected - opened.checksums.keys())}")
    return own


def read_checked(handle: io.RawIOBase, entry: TensorEntry, opened: ModelFile) -> np.ndarray:
    """Read one stored tensor as a new host array and verify its checksum."""
    value = container.read_array(handle, entry)
    _verify(entry, value, opened)
    return value


def _verify(entry: TensorEntry, array: np.ndarray, opened: ModelFile) -> None:
    if tensor_checksum(entry.name, entry.code, entry.shape, array) != opened.checksums.get(entry.name):
        raise CheckpointError(f"{opened.source}: tensor {printable(entry.name)} fails its checksum; the file is corrupt")
