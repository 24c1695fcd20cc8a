"""``neuroflow export MODEL.safetensors --onnx OUT.onnx``: a saved model as a file another runtime runs.

The model file is loaded (and checked) as ``nf.load`` does, then written by
:func:`neuroflow.export.to_onnx` with a free batch dimension. One sample's
shape comes from ``--input-shape``, the model's ``input_shape``, or the
``in_features`` of its first layer with parameters, in that order.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from neuroflow.checkpoint import load
from neuroflow.cli.arguments import sample_shape_arg
from neuroflow.errors import ConfigError
from neuroflow.export import DEFAULT_OPSET, to_onnx
from neuroflow.operator import Operator

HELP = "export a model file to ONNX (needs the onnx package: pip install 'neuroflow-core[onnx]')"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, metavar="MODEL.safetensors", help="a model file written by nf.save")
    parser.add_argument("--onnx", type=Path, required=True, metavar="OUT.onnx", help="the ONNX file to write")
    parser.add_argument("--input-shape", type=sample_shape_arg, metavar="C,H,W",
                        help="the shape of one sample, without the batch (1,28,28 for an MNIST CNN; default: "
                             "the first Linear's in_features)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                        help=f"ONNX opset of the default domain, 13 or later (default: {DEFAULT_OPSET}; from 20 GELU "
                             "is one Gelu node)")


def sample_shape(model: Operator, given: tuple[int, ...] | None) -> tuple[int, ...]:
    """One sample's shape: ``given``, the model's ``input_shape``, or its first layer's ``in_features``."""
    if given is not None:
        return given
    shape = getattr(model, "input_shape", None)
    if shape is not None:
        return tuple(int(s) for s in shape)
    first = next((op for op in model.modules() if not any(True for _ in op.children()) and op.parameters()), None)
    if first is not None and hasattr(first, "in_features"):
        return (int(first.in_features),)
    raise ConfigError(f"cannot tell the input shape of a model starting with {first!r}; pass --input-shape "
                      "with one sample's shape, e.g. --input-shape 1,28,28")


def run(args: argparse.Namespace) -> int:
    model = load(args.model, device="cpu")
    report = to_onnx(model, args.onnx, (1, *sample_shape(model, args.input_shape)), opset=args.opset)
    print(report)
    return 0
