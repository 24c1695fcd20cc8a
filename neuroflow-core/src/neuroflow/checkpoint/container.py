"""The safetensors container: a validated header reader, exact tensor reads, and an atomic writer.

Layout: 8 bytes little-endian header length N, N bytes of JSON header, then the
tensor bytes. The header maps each tensor name to ``dtype``, ``shape`` and
``data_offsets`` (relative to the end of the header) and may hold a
``__metadata__`` map of strings. :func:`read_header` checks all of it against
the file's size before a single tensor byte is read, so a corrupt or hostile
file costs at most its header to refuse.
"""

from __future__ import annotations

import io
import json
import math
import operator
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from neuroflow.checkpoint.atomic import write_atomically
from neuroflow.checkpoint.errors import CheckpointError

#: Largest header accepted (the safetensors library's own limit).
MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_DIMS = 32

#: safetensors dtype codes NeuroFlow reads, as little-endian numpy dtypes. BF16 is read as its
#: 16 raw bits (numpy has no bfloat16) and widened to float32 by :func:`widen_bfloat16`.
DTYPES: dict[str, np.dtype[Any]] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
FLOAT_CODES = ("F64", "F32", "F16", "BF16")
_CODE_OF = {np.dtype(dtype).newbyteorder("=").str: code for code, dtype in DTYPES.items() if code != "BF16"}


def dtype_code(dtype: Any) -> str:
    """The safetensors code of a numpy dtype (``float32`` → ``"F32"``)."""
    code = _CODE_OF.get(np.dtype(dtype).newbyteorder("=").str)
    if code is None:
        raise CheckpointError(f"dtype {np.dtype(dtype)} cannot be stored; supported: {', '.join(_CODE_OF.values())}")
    return code


class TensorEntry(NamedTuple):
    """One tensor of a file: its safetensors dtype code, shape and absolute byte range.

    A named tuple: a load makes one per tensor, at half the cost of a frozen dataclass.
    """

    name: str
    code: str
    shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def dtype(self) -> np.dtype[Any]:
        return DTYPES[self.code]

    @property
    def elements(self) -> int:
        """How many values the tensor holds."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class Header:
    """A validated safetensors header: metadata strings and tensor entries, consistent with the file size."""

    path: Path
    file_size: int
    metadata: dict[str, str]
    tensors: dict[str, TensorEntry]
    data_start: int = 0  # where the tensor bytes begin: 8 + the header's length

    @property
    def total_elements(self) -> int:
        return sum(entry.elements for entry in self.tensors.values())


def read_header(path: str | os.PathLike[str], max_header_bytes: int = MAX_HEADER_BYTES) -> Header:
    """Read and check the header of the safetensors file at ``path``; raises CheckpointError.

    Checked: the length prefix against the file size and ``max_header_bytes``;
    UTF-8 JSON object without duplicate keys; string metadata; each tensor's
    dtype, shape (at most 32 non-negative dimensions) and byte range, which
    must match its size and, all together, tile the data section exactly.
    """
    file = Path(path)
    try:
        with open_regular(file) as handle:
            return read_header_from(handle, file, max_header_bytes)
    except OSError as exc:
        raise CheckpointError(f"cannot read {file}: {exc}") from exc


#: What a path that is no regular file is, by the first test of its mode that holds.
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
#: Opening never waits: a FIFO without a writer would block ``open`` until one came.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def open_regular(file: Path) -> io.FileIO:
    """``file`` opened for unbuffered reading; CheckpointError unless it is a regular file.

    A FIFO, a device, a socket or a directory would hang the reader or feed it
    without end, so the path is checked before it is opened, and what was
    opened (without waiting, in case the path was replaced meanwhile) is
    checked again. Raises OSError when the file cannot be opened at all.
    """
    _check_regular(file, os.stat(file).st_mode)
    descriptor = os.open(file, _OPEN_FLAGS)
    try:
        _check_regular(file, os.fstat(descriptor).st_mode)
    except BaseException:
        os.close(descriptor)
        raise
    return io.FileIO(descriptor, "rb", closefd=True)


def _check_regular(file: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "no regular file")
    raise CheckpointError(
        f"{file} is {kind}, not a regular file; a model file or checkpoint is read from a regular file "
        "(written by nf.save or a Trainer): copy a stream into a file first"
    )


def read_header_from(handle: io.RawIOBase, file: Path, max_header_bytes: int = MAX_HEADER_BYTES) -> Header:
    """:func:`read_header` of a file already open (positioned anywhere); reads the header only."""
    size = os.fstat(handle.fileno()).st_size
    handle.seek(0)
    length = _header_length(file, size, handle.read(8) or b"", max_header_bytes)
    raw = handle.read(length) or b""
    if len(raw) != length:
        raise CheckpointError(f"{file}: the file changed while it was read")
    return _parse(file, size, length, raw)


def parse_header(file: Path, content: memoryview, max_header_bytes: int = MAX_HEADER_BYTES) -> Header:
    """:func:`read_header` of a file whose whole content is ``content`` (a mapping of it)."""
    length = _header_length(file, len(content), content[:8], max_header_bytes)
    return _parse(file, len(content), length, bytes(content[8:8 + length]))


def _header_length(file: Path, size: int, prefix: bytes | memoryview, max_header_bytes: int) -> int:
    if size < 8 or len(prefix) < 8:
        raise CheckpointError(f"{file}: {size} bytes is too short for a safetensors file (at least 8)")
    length = int.from_bytes(prefix, "little")
    if length < 2 or length > min(max_header_bytes, size - 8):
        raise CheckpointError(
            f"{file}: header length {length} is impossible for a file of {size} bytes "
            f"(must be 2..{min(max_header_bytes, size - 8)}); the file is truncated or not safetensors"
        )
    return length


def _parse(file: Path, size: int, length: int, raw: bytes) -> Header:
    header = _object(file, _parse_json(file, raw))
    metadata = header.pop("__metadata__", {})
    if isinstance(metadata, _Members):
        metadata = _object(file, metadata)
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"{file}: __metadata__ must map strings to strings")
    data_size = size - 8 - length
    tensors = {name: _entry(file, name, spec, 8 + length) for name, spec in header.items()}
    _check_tiling(file, tensors, 8 + length, data_size)
    return Header(file, size, metadata, tensors, 8 + length)


class _Members(list):  # type: ignore[type-arg]
    """A JSON object as the (name, value) pairs written, so that a name given twice can be told.

    The parser makes one per object at the cost of a list, where a Python hook
    per object doubled the time to parse a small model's header; :func:`_object`
    turns those the header is made of (itself, its metadata, each tensor's
    description) into dicts. An object anywhere else stays a list of pairs and
    fails the check of the field it stands in for (a shape, a metadata string).
    """


def _object(file: Path, members: _Members) -> dict[str, Any]:
    """``members`` as a dict; raises CheckpointError naming a name given twice."""
    result = dict(members)
    if len(result) != len(members):
        names = [name for name, _ in members]
        duplicate = next(name for name in names if names.count(name) > 1)
        raise CheckpointError(f"{file}: header names {duplicate!r} twice")
    return result


def _parse_json(file: Path, raw: bytes) -> _Members:
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_Members)
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{file}: header is not UTF-8 ({exc.reason} at byte {8 + exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise CheckpointError(f"{file}: header is not valid JSON ({exc})") from None
    if not isinstance(header, _Members):
        raise CheckpointError(f"{file}: header is a JSON {type(header).__name__}; expected an object")
    return header


def _are_counts(values: list[Any]) -> bool:
    """Whether every item is an int >= 0 (JSON gives no int subclass but bool, which ``type(v) is int`` excludes)."""
    for value in values:
        if type(value) is not int or value < 0:
            return False
    return True


def _entry(file: Path, name: str, spec: Any, base: int) -> TensorEntry:
    if not isinstance(spec, _Members):
        raise CheckpointError(f"{file}: tensor {name!r} is described by a {type(spec).__name__}; expected an object")
    spec = _object(file, spec)
    code, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if not isinstance(code, str) or code not in DTYPES:  # a list would not even be a dict key
        raise CheckpointError(
            f"{file}: tensor {name!r} has dtype {code!r}; NeuroFlow reads {', '.join(DTYPES)}"
        )
    if type(shape) is not list or len(shape) > MAX_DIMS or not _are_counts(shape):  # an object is _Members
        raise CheckpointError(f"{file}: tensor {name!r} has shape {shape!r}; expected at most {MAX_DIMS} sizes >= 0")
    if not (type(offsets) is list and len(offsets) == 2 and _are_counts(offsets)):
        raise CheckpointError(f"{file}: tensor {name!r} has data_offsets {offsets!r}; expected [begin, end]")
    begin, end = offsets
    expected = math.prod(shape) * DTYPES[code].itemsize
    if end - begin != expected:
        raise CheckpointError(
            f"{file}: tensor {name!r} ({code}, shape {tuple(shape)}) needs {expected} bytes; "
            f"its data_offsets {offsets} span {end - begin}"
        )
    return TensorEntry(name, code, tuple(shape), base + begin, base + end)


_BYTE_RANGE = operator.attrgetter("start", "stop")


def _check_tiling(file: Path, tensors: dict[str, TensorEntry], base: int, data_size: int) -> None:
    position = base
    for entry in sorted(tensors.values(), key=_BYTE_RANGE):
        if entry.start != position:
            problem = "overlaps the previous tensor" if entry.start < position else "leaves a gap before it"
            raise CheckpointError(
                f"{file}: tensor {entry.name!r} starts at data offset {entry.start - base}, which {problem}"
            )
        position = entry.stop
    if position - base != data_size:
        raise CheckpointError(
            f"{file}: the header describes {position - base} bytes of tensor data but the file holds {data_size}; "
            "it is truncated or was appended to"
        )


def read_into(handle: io.RawIOBase, entry: TensorEntry, out: np.ndarray) -> None:
    """Fill the C-contiguous array ``out`` (of ``entry``'s dtype and size) with ``entry``'s bytes."""
    view = out.reshape(-1).view(np.uint8).data
    handle.seek(entry.start)
    filled = 0
    while filled < len(view):
        got = handle.readinto(view[filled:])
        if not got:
            raise CheckpointError(f"tensor {entry.name!r}: the file ended early; it changed while being read")
        filled += got


def read_array(handle: io.RawIOBase, entry: TensorEntry) -> np.ndarray:
    """``entry`` as a new host array in its stored dtype (BF16 as raw uint16 bits)."""
    out = np.empty(entry.shape, entry.dtype)
    read_into(handle, entry, out)
    return out


def widen_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values given as their uint16 bit patterns, as float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def write(path: str | os.PathLike[str], tensors: dict[str, np.ndarray], metadata: dict[str, str]) -> Path:
    """Write ``tensors`` (host arrays) and ``metadata`` as a safetensors file, atomically."""
    try:
        from safetensors.numpy import save_file
    except ImportError:  # pragma: no cover - the extra is installed in every supported setup
        raise CheckpointError(
            "writing model files needs the safetensors package: pip install 'neuroflow-core[safetensors]'"
        ) from None
    contiguous = {name: np.ascontiguousarray(array) for name, array in tensors.items()}
    return write_atomically(path, lambda temp: save_file(contiguous, temp, metadata=metadata))
