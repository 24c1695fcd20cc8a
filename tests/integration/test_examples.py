"""The example configs run from the command line as a new user would run them, and do what they say.

sunspots: the forecaster beats the persistence forecast on the held-out tail. LoRA: the MNIST MLP of
examples/mnist_mlp.toml, saved, is fine-tuned on Fashion-MNIST by examples/lora_fashion.toml, fused and
saved as a plain model — on a subset of both data sets (the examples' other settings unchanged) to stay fast.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import neuroflow as nf
from neuroflow.cli import main
from neuroflow.lora import LoRAAdapter

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SUBSET = {"train": 4000, "test": 1000}


def forecast_mse(out: str, row: str) -> float:
    found = re.search(rf"^\s+{row}\s+MSE (\S+)\s+RMSE (\S+)", out, re.MULTILINE)
    assert found, out
    return float(found.group(1))


@pytest.mark.parametrize("example", ["sunspots.toml", "sunspots_wavelet.toml"])
def test_sunspot_forecaster_beats_persistence_on_the_held_out_tail(example, capsys):
    assert main(["train", str(EXAMPLES / example)]) == 0
    out = capsys.readouterr().out
    model, persistence = forecast_mse(out, "model"), forecast_mse(out, "persistence")
    print(f"{example}: held-out MSE {model:.1f} vs persistence {persistence:.1f}")
    # With a margin: a forecaster that learned nothing sits at or above persistence.
    assert model < 0.8 * persistence
    assert "the model beats persistence" in out


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {toml_value(v)}" for key, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)  # strings, numbers and booleans are written alike in JSON and TOML


def write_config(path: Path, raw: dict[str, Any]) -> Path:
    """``raw`` (as tomllib reads it) written back as TOML."""
    lines = [f"{key} = {toml_value(value)}" for key, value in raw.items() if not isinstance(value, dict)]
    for table, keys in ((k, v) for k, v in raw.items() if isinstance(v, dict)):
        lines += [f"[{table}]", *(f"{key} = {toml_value(value)}" for key, value in keys.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def with_subset(example: str, loader: Any, directory: Path) -> Path:
    """The example config with its [data] dataset replaced by .npz files of its first samples."""
    raw = tomllib.loads((EXAMPLES / example).read_text())
    data = raw["data"]
    for split, n in SUBSET.items():
        full = loader(split, flat=data["flat"], normalize=data["normalize"])
        np.savez(directory / f"{example}.{split}.npz", x=full.x[:n], y=full.y[:n])
    raw["data"] = {"train": f"{example}.train.npz", "test": f"{example}.test.npz"}
    return write_config(directory / example, raw)


def accuracy(model: nf.Operator, dataset: Path) -> float:
    with np.load(dataset) as arrays:
        return float((model.forward(arrays["x"]).argmax(axis=1) == arrays["y"]).mean())


def test_lora_fine_tune_of_the_saved_mnist_mlp_on_fashion_mnist_fuses_and_saves(tmp_path, capsys):
    try:
        base_config = with_subset("mnist_mlp.toml", nf.data.mnist, tmp_path)
        lora_config = with_subset("lora_fashion.toml", nf.data.fashion_mnist, tmp_path)
    except FileNotFoundError as exc:
        pytest.skip(f"MNIST or Fashion-MNIST is not on this machine: {exc}")
    # lora_fashion.toml reads mnist_mlp.safetensors next to itself
    assert tomllib.loads(lora_config.read_text())["model"]["from"] == "mnist_mlp.safetensors"
    assert main(["train", str(base_config), "--save", str(tmp_path / "mnist_mlp.safetensors")]) == 0
    capsys.readouterr()
    assert main(["train", str(lora_config)]) == 0
    out = capsys.readouterr().out
    assert "fused the LoRA adapters into the base weights" in out
    reported = float(re.search(r"^test: loss \S+  accuracy (\S+)", out, re.MULTILINE).group(1))

    base = nf.load(tmp_path / "mnist_mlp.safetensors")
    fused = nf.load(tmp_path / "mnist_mlp_fashion_lora.safetensors")
    assert not any(isinstance(op, LoRAAdapter) for op in fused.modules())
    assert [repr(op) for op in fused] == [repr(op) for op in base]
    base_parameters = dict(base.named_parameters())
    for name, p in fused.named_parameters():
        if name.endswith("bias"):  # lora_fusion = true: only the adapters trained
            np.testing.assert_array_equal(p.data, base_parameters[name].data, err_msg=name)
        else:
            assert not np.allclose(p.data, base_parameters[name].data), name
    test_file = tmp_path / "lora_fashion.toml.test.npz"
    fused_accuracy, base_accuracy = accuracy(fused, test_file), accuracy(base, test_file)
    print(f"Fashion-MNIST accuracy: MNIST model {base_accuracy:.3f}, after LoRA and fusing {fused_accuracy:.3f}")
    assert fused_accuracy == pytest.approx(reported, abs=1e-4)  # the saved model is the one evaluated
    assert fused_accuracy > base_accuracy + 0.3
