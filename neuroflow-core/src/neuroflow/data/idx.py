"""IDX files (the MNIST format): a magic number, big-endian dimensions, then the raw values."""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

#: IDX type byte → big-endian numpy dtype, as defined by the format (LeCun et al.).
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file, plain or gzip-compressed, into a native-endian numpy array.

    Compression is recognised from the file's first bytes, not its name. A file whose header is
    malformed or whose size does not match its dimensions raises ``ValueError`` naming the file.
    """
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise ValueError(f"{os.fspath(path)}: not an IDX file: {len(raw)} bytes, shorter than the 4-byte magic number")
    zero, type_code, ndim = int.from_bytes(raw[:2], "big"), raw[2], raw[3]
    if zero != 0 or type_code not in IDX_DTYPES:
        known = ", ".join(f"0x{code:02X}" for code in IDX_DTYPES)
        raise ValueError(
            f"{os.fspath(path)}: not an IDX file: magic number 0x{raw[:4].hex().upper()}; "
            f"expected 0x0000TTDD with type TT one of {known} and DD dimensions"
        )
    if ndim == 0:
        raise ValueError(f"{os.fspath(path)}: IDX header declares 0 dimensions; expected at least 1")
    header_size = 4 + 4 * ndim
    if len(raw) < header_size:
        raise ValueError(
            f"{os.fspath(path)}: truncated IDX header: {ndim} dimensions need {header_size} bytes, file has {len(raw)}"
        )
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    dtype = IDX_DTYPES[type_code]
    expected = int(np.prod(shape, dtype=object)) * dtype.itemsize
    found = len(raw) - header_size
    if found != expected:
        problem = "truncated" if found < expected else f"{found - expected} bytes too long"
        raise ValueError(
            f"{os.fspath(path)}: IDX file is {problem}: shape {shape} of {dtype.name} needs {expected} data bytes, "
            f"found {found}"
        )
    values = np.frombuffer(raw, dtype=dtype, offset=header_size).reshape(shape)
    # A native-endian, writable copy: arithmetic on big-endian views is slow and the buffer is read-only.
    return values.astype(dtype.newbyteorder("="))


def _read_bytes(path: str | os.PathLike[str]) -> bytes:
    with open(path, "rb") as f:
        raw = f.read()
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise ValueError(f"{os.fspath(path)}: damaged gzip data ({error}); the file is truncated or corrupt") from error
