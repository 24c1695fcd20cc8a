"""Hostile and broken model files: every one refused with a CheckpointError, before anything large is allocated."""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import neuroflow as nf
from neuroflow import ops
from neuroflow.checkpoint import CheckpointError

CORPUS = Path(__file__).parent / "fuzz_corpus"
EXPECTED: dict[str, str] = json.loads((CORPUS / "expected.json").read_text())
#: A load of a file of a few kilobytes may use this much memory at most, whatever the file says.
PEAK_LIMIT = 4 * 2**20


def test_the_corpus_and_its_expectations_list_the_same_files():
    assert sorted(EXPECTED) == sorted(p.name for p in CORPUS.glob("*.bin"))


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_file_is_refused_with_a_clear_error(name, mmap):
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as info:
            nf.load(CORPUS / name, mmap=mmap)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert EXPECTED[name] in str(info.value)
    assert str(info.value).isprintable()  # nothing of the file's reaches a terminal as a control character
    if "distribution" in EXPECTED[name]:  # what a file says to install is never shown as an install command
        assert "pip install" not in str(info.value)
    assert peak < PEAK_LIMIT


@pytest.fixture(scope="module")
def valid_file(tmp_path_factory):
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(5, 4), ops.ReLU(), ops.Dropout(0.1), ops.Linear(4, 2))
    path = tmp_path_factory.mktemp("fuzz") / "valid.safetensors"
    nf.save(model, path, quantize="int8")
    expected = nf.load(path).state_dict()
    return path.read_bytes(), expected, path.parent


def _header_end(content: bytes) -> int:
    return 8 + struct.unpack("<Q", content[:8])[0]


mutation = st.one_of(
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("flip"), st.floats(0, 1, exclude_max=True), st.integers(0, 7)),
    st.tuples(st.just("flip_header"), st.floats(0, 1, exclude_max=True), st.integers(0, 7)),
    st.tuples(st.just("overwrite_header"), st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("length"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=16)),
)


def _mutate(content: bytes, steps: list[tuple]) -> bytes:
    data = bytearray(content)
    for step in steps:
        kind, where = step[0], step[1]
        if kind == "length":
            data[:8] = struct.pack("<Q", where)
            continue
        if not data:
            continue
        end = min(_header_end(bytes(data)), len(data)) if len(data) >= 8 else len(data)
        span = end if kind in ("flip_header", "overwrite_header") else len(data)
        at = int(where * span)
        if kind == "truncate":
            del data[at:]
        elif kind in ("flip", "flip_header"):
            data[min(at, len(data) - 1)] ^= 1 << step[2]
        elif kind == "overwrite_header":
            data[at:at + len(step[2])] = step[2]
        elif kind == "insert":
            data[at:at] = step[2]
    return bytes(data)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(mutation, min_size=1, max_size=3), mmap=st.booleans())
def test_mutated_files_are_refused_or_load_the_same_model(valid_file, steps, mmap):
    content, expected, folder = valid_file
    mutated = _mutate(content, steps)
    path = folder / "mutated.safetensors"
    path.unlink(missing_ok=True)  # a new file each time: a mapped one must not be rewritten in place
    path.write_bytes(mutated)
    tracemalloc.start()
    try:
        model = nf.load(path, mmap=mmap)
    except CheckpointError:
        model = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < PEAK_LIMIT
    if model is not None:  # e.g. a changed byte of JSON whitespace: then it must be the very same model
        state = model.state_dict()
        assert list(state) == list(expected)
        assert all(np.array_equal(state[k], expected[k]) for k in state)
