"""Reading a model file's tensors into the model rebuilt from it: the file's bytes, checked, then put in place.

The file is mapped copy-on-write (or, where it cannot be, read into one
buffer): the pages come straight from the OS file cache, where reading into
fresh memory costs its page faults first (ResNet-18's 45 MB on the 2-core
machine of ``benchmarks/checkpoint.py``: 9.5 ms to read, 0.4 ms to map;
CRC-32 takes 2.7 ms with ISA-L, 11 ms with zlib; the MLP's 0.44 MB: 0.25 ms of faults when the
process has no free pages at hand). Every tensor's checksum is verified before
any value is used (large files by several threads: the CRC releases
the GIL). When the model takes every stored tensor as it is, its parameters
become views of that buffer, without a copy; otherwise (INT8 weights and
their scales, float16 or bfloat16 tensors, the optimizer state of a training
checkpoint) each tensor is converted or copied into an array of its own and
the buffer is dropped.

A mapped file must not be rewritten in place while the model lives (a model
file replaced with ``nf.save``, which writes a new file and renames it, is
safe): the OS would show the model the new bytes, or end the process with
SIGBUS where the file shrank. ``nf.load(path, mmap=False)`` reads instead.
"""

from __future__ import annotations

import io
import mmap as mmap_module
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from neuroflow.checkpoint import container
from neuroflow.checkpoint.allocation_guard import is_placeholder
from neuroflow.checkpoint.checksums import TensorVerifier
from neuroflow.checkpoint.container import Header, TensorEntry
from neuroflow.checkpoint.errors import CheckpointError
from neuroflow.checkpoint.quantize import dequantize_int8
from neuroflow.tensor import Tensor

if TYPE_CHECKING:
    from neuroflow.checkpoint.model_file import ModelFile

#: Bytes of tensors per checksumming thread: below it a thread costs more to start than it saves.
BYTES_PER_THREAD = 4 << 20
MAX_THREADS = 8


@dataclass(frozen=True)
class FileContent:
    """The bytes of a model file from ``base`` on (its tensor data, or the whole file when mapped)."""

    data: np.ndarray  # uint8
    base: int
    mapped: bool

    def array(self, entry: TensorEntry) -> np.ndarray:
        """``entry`` as an array of its stored dtype and shape viewing the buffer (unaligned if the file is)."""
        return np.ndarray(entry.shape, entry.dtype, self.data, entry.start - self.base)


def open_file(path: str | os.PathLike[str], mmap: bool = True) -> tuple[Header, FileContent]:
    """The checked header of the safetensors file at ``path`` and its tensor bytes.

    Only a regular file is opened (see :func:`container.open_regular <neuroflow.checkpoint.container.open_regular>`).
    With ``mmap`` the file is mapped copy-on-write where the OS can (else, or
    when mapping fails, read). A read file's header is checked before its
    data is read, so a file that is no safetensors file costs its first bytes only.
    """
    file = path if isinstance(path, Path) else Path(path)
    try:
        with container.open_regular(file) as handle:
            mapping = _map(handle.fileno()) if mmap else None
            if mapping is not None:
                data = np.frombuffer(mapping, np.uint8)
                return container.parse_header(file, memoryview(mapping)), FileContent(data, 0, True)
            header = container.read_header_from(handle, file)
            data = np.empty(header.file_size - header.data_start, np.uint8)
            _read_fully(handle, data.data, file)
            return header, FileContent(data, header.data_start, False)
    except OSError as exc:
        raise CheckpointError(f"cannot read {file}: {exc}") from exc


def _map(descriptor: int) -> mmap_module.mmap | None:
    """A private (copy-on-write) mapping of the whole open file, or None where there is none to be had."""
    if not hasattr(mmap_module, "MAP_PRIVATE"):  # Windows would lock the file
        return None
    try:
        return mmap_module.mmap(descriptor, 0, access=mmap_module.ACCESS_COPY)  # 0: the whole file, as mmap finds it
    except (OSError, ValueError):  # e.g. an empty file, a file system that cannot map, out of mappings
        return None


def _read_fully(handle: io.RawIOBase, view: memoryview, file: Path) -> None:
    filled = 0
    while filled < len(view):
        got = handle.readinto(view[filled:])
        if not got:
            raise CheckpointError(f"{file}: the file ended early; it changed while being read")
        filled += got


def checking_threads(size: int) -> int:
    """How many threads checksum ``size`` bytes: one per :data:`BYTES_PER_THREAD`, at most the usable cores and 8."""
    wanted = size // BYTES_PER_THREAD
    if wanted < 2:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(wanted, cores, MAX_THREADS)


class Verification:
    """The checksums of a file's tensors, checked by background threads for a large file.

    Started before the model is rebuilt, so that on a machine with a free
    core the checking (2.7 ms of one core for the 45 MB of ResNet-18 with ISA-L, 11 ms with zlib) overlaps
    the rebuilding; the CRC releases the GIL. A file below two
    :data:`BYTES_PER_THREAD` is checked by :meth:`wait` on the calling thread:
    a worker needs the GIL between tensors, and while the caller runs Python
    it waits up to the interpreter's switch interval (5 ms) for it, far more
    than the 0.1 ms the MLP's 0.44 MB take. :meth:`wait` raises CheckpointError
    naming every tensor whose bytes do not match.
    """

    def __init__(self, entries: list[TensorEntry], content: FileContent, opened: ModelFile) -> None:
        self._verifier = TensorVerifier(opened.checksums, opened.source)
        self._cancelled = False
        self._entries = entries
        self._view, self._base = content.data.data, content.base
        workers = min(checking_threads(sum(entry.stop - entry.start for entry in entries)), len(entries))
        shares = _shares(entries, workers) if workers > 1 else []
        self._pending = [_pool().submit(self._check, share) for share in shares if share]

    def _check(self, entries: list[TensorEntry]) -> None:
        check, view, base = self._verifier.check, self._view, self._base
        for entry in entries:
            if self._cancelled:
                return
            check(entry, view[entry.start - base:entry.stop - base])

    def cancel(self) -> None:
        """Stop checking (the load failed for another reason)."""
        self._cancelled = True

    def wait(self) -> None:
        """Wait for every checksum; raise CheckpointError naming the tensors that fail theirs."""
        if not self._pending:
            self._check(self._entries)
        for future in self._pending:
            future.result()
        self._verifier.finish()


def _shares(entries: list[TensorEntry], workers: int) -> list[list[TensorEntry]]:
    shares: list[list[TensorEntry]] = [[] for _ in range(workers)]
    loads = [0] * workers
    for entry in sorted(entries, key=lambda e: e.start - e.stop):  # largest first, each to the least loaded
        least = loads.index(min(loads))
        shares[least].append(entry)
        loads[least] += entry.stop - entry.start
    return shares


_executor: ThreadPoolExecutor | None = None
_executor_pid = 0


def _pool() -> ThreadPoolExecutor:
    global _executor, _executor_pid
    if _executor is None or _executor_pid != os.getpid():  # a forked child has none of its parent's threads
        _executor = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="neuroflow-checksum")
        _executor_pid = os.getpid()
    return _executor


def read_weights(tensors: dict[str, Tensor], opened: ModelFile, content: FileContent, verification: Verification) -> None:
    """Fill a rebuilt model's ``tensors`` (host arrays, by name) from the file; raise CheckpointError if a checksum fails.

    Every checksum is verified first (by ``verification``, started over the
    file's model tensors). A tensor still holding the rebuild's placeholder
    gets a new array, or a view of ``content`` when the model takes all of
    the file's data as it is; the others are overwritten in place.
    """
    verification.wait()
    stored, scales = opened.header.tensors, opened.scales
    taken = 0  # bytes the model takes as they are stored
    for name, tensor in tensors.items():
        entry = stored[name]
        dtype = entry.dtype
        if name not in scales and dtype == tensor.data.dtype and dtype.isnative:
            taken += entry.stop - entry.start
    share = taken == opened.header.file_size - opened.header.data_start
    for name, tensor in tensors.items():
        entry = stored[name]
        if is_placeholder(tensor.data):
            if share:
                value = content.array(entry)
                flags = value.flags
                if flags.aligned and flags.writeable:
                    tensor.data = value
                    continue
            tensor.data = np.empty(tensor.data.shape, tensor.data.dtype)
        _fill(tensor.data, entry, content, opened)


def _fill(target: np.ndarray, entry: TensorEntry, content: FileContent, opened: ModelFile) -> None:
    if entry.name in opened.scales:
        q, scale = content.array(entry), content.array(opened.header.tensors[opened.scales[entry.name]])
        if isinstance(target, np.ndarray) and target.flags.c_contiguous:
            dequantize_int8(q, scale, target)
        else:
            target[...] = dequantize_int8(q, scale, np.empty(q.shape, target.dtype))
        return
    value = content.array(entry)
    if entry.code == "BF16":
        value = container.widen_bfloat16(value)
    target[...] = value
