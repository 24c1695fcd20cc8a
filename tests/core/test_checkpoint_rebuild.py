"""Rebuilding a model from a file: placeholders instead of initial values, topology errors that name the op."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.checkpoint import CheckpointError
from neuroflow.checkpoint.allocation_guard import is_placeholder, limit_random_draws
from neuroflow.checkpoint.model_file import MODEL_FORMAT, model_payload, write_model_file


def test_a_placeholder_holds_no_memory_whatever_its_size_and_converts_to_another():
    tracemalloc.start()
    try:
        with limit_random_draws(held=10**9, source="f") as guard:
            draw = guard.uniform(-1.0, 1.0, (20_000, 20_000))  # 3.2 GB if it were an array
            draw *= 3.0  # constructors may scale their draws in place
            converted = draw.astype(np.float32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20
    assert is_placeholder(draw) and draw.shape == (20_000, 20_000) and draw.dtype == np.float64
    assert is_placeholder(converted) and converted.shape == draw.shape and converted.dtype == np.float32
    assert draw.strides == (0, 0) and not draw[:3, :3].any()
    assert not is_placeholder(draw[:2, :2] + 1)  # arithmetic gives an ordinary array


def test_a_loaded_model_holds_the_files_values_and_no_placeholder(tmp_path):
    nf.manual_seed(3)
    model = nf.Sequential(ops.Linear(300, 40), ops.ReLU(), ops.Linear(40, 5))
    nf.save(model, tmp_path / "m.safetensors")
    for mmap in (True, False):
        loaded = nf.load(tmp_path / "m.safetensors", mmap=mmap)
        for (name, saved), (_, tensor) in zip(model.named_parameters(), loaded.named_parameters(), strict=True):
            assert type(tensor.data) is np.ndarray and tensor.data.flags.c_contiguous, name
            assert np.array_equal(tensor.data, saved.data), name


def _file_with_topology(tmp_path, edit) -> str:
    tensors, meta = model_payload(nf.Sequential(nf.Sequential(ops.Linear(2, 2), ops.ReLU())), MODEL_FORMAT, None)
    topology = json.loads(meta["topology"])
    edit(topology["root"])
    path = tmp_path / "m.safetensors"
    write_model_file(path, tensors, {**meta, "topology": json.dumps(topology)})
    return str(path)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda root: root["children"][0]["children"][1].pop("config"),
     "op model.0.1 needs a string 'type' and an object 'config'"),
    (lambda root: root["children"][0].update(children={"0": {}}), "op model.0 has 'children' that is not a list of ops"),
    (lambda root: root["children"][0]["children"][0]["config"].update(in_features=-2), "cannot rebuild op model.0.0"),
    (lambda root: root["children"][0]["children"][1].update(children=[]), "op model.0.1 (ReLU) is saved with child ops"),
])
def test_topology_errors_name_the_op_by_its_path(tmp_path, edit, message):
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        nf.load(_file_with_topology(tmp_path, edit))


def _raw_file(tmp_path, header_json: str) -> str:
    raw = header_json.encode()
    path = tmp_path / "h.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(8))
    return str(path)


_SPEC = '{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'


@pytest.mark.parametrize(("header", "message"), [
    ('{"w":' + _SPEC + ',"w":' + _SPEC + '}', "header names 'w' twice"),
    ('{"__metadata__":{"format":"a","format":"b"},"w":' + _SPEC + '}', "header names 'format' twice"),
    ('{"w":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}}', "header names 'dtype' twice"),
    ("[]", "header is a JSON list; expected an object"),
    ('{"w":[["dtype","F32"]]}', "tensor 'w' is described by a list; expected an object"),
    ('{"w":{"dtype":"F32","shape":{"0":2},"data_offsets":[0,8]}}', "tensor 'w' has shape"),
    ('{"w":{"dtype":["F32"],"shape":[2],"data_offsets":[0,8]}}', "tensor 'w' has dtype"),
    ('{"__metadata__":{"format":{"a":"b"}},"w":' + _SPEC + '}', "__metadata__ must map strings to strings"),
])
def test_header_objects_are_refused_when_a_name_repeats_or_an_array_stands_in(tmp_path, header, message):
    for mmap in (True, False):
        with pytest.raises(CheckpointError, match=message.replace("[", r"\[")):
            nf.load(_raw_file(tmp_path, header), mmap=mmap)
