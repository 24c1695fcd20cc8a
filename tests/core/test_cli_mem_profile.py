"""``neuroflow mem-profile`` and ``neuroflow train`` under a memory budget, run in-process through ``main(argv)``."""

from __future__ import annotations

import importlib.util
import re
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops, registry
from neuroflow.cli import main
from neuroflow.cli import mem_profile as command
from neuroflow.hookspecs import hookimpl
from neuroflow.plugins import plugin_manager

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mnist_budget.toml"
MiB = 2**20


def printed_peak(out: str) -> float:
    return float(re.search(r"predicted peak of a training step: ([\d.]+) MiB", out).group(1))


def test_example_config_gives_a_plan_for_a_64_mb_budget(capsys):
    assert main(["mem-profile", str(EXAMPLE), "--budget-mb", "64"]) == 0
    out = capsys.readouterr().out
    assert "samples of shape (784,) (from [data] dataset = 'mnist')" in out
    assert "memory plan for batch 256" in out and "0 Linear(784→128)" in out
    assert "budget: 64.000 MiB -> fits" in out
    largest = int(re.search(r"largest batch that fits: (\d+)", out).group(1))
    assert largest > 256
    model = nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10))
    expected = nf.memory.profile(model, (256, 784), optimizer=nf.optim.AdamW()).predicted_peak_bytes / MiB
    assert printed_peak(out) == pytest.approx(expected, abs=1e-3)


def test_the_configs_own_budget_splits_the_batch_keeping_the_effective_batch(capsys):
    assert main(["mem-profile", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "budget: 3.400 MiB -> does NOT fit" in out
    # the input a step holds (all its micro-batches, and those the loader holds ahead) and the host margin counted
    assert "to keep the effective batch 256: batch_size=8 x gradient_accumulation_steps=32 (= 256)" in out


def test_a_budget_nothing_fits_exits_1_and_says_what_does_not_fit(capsys):
    assert main(["mem-profile", str(EXAMPLE), "--batch-size", "256", "--budget-mb", "2.2"]) == 1
    out = capsys.readouterr().out
    assert "budget: 2.200 MiB -> does NOT fit" in out
    single = int(re.search(r"largest batch that fits: (\d+)", out).group(1))
    assert re.search(rf"nothing fits: no batch × accumulation keeps the effective batch 256 within 2.200 MiB: "
                     rf".* batch_size={single} with gradient_accumulation_steps=1 fits", out)
    assert main(["mem-profile", str(EXAMPLE), "--batch-size", str(single), "--budget-mb", "2.2"]) == 0
    assert "budget: 2.200 MiB -> fits" in capsys.readouterr().out


@pytest.fixture
def tiny_model():
    """A registered model name whose builder stores a default input shape."""

    def tiny(width: int = 16):
        return nf.Sequential(ops.Flatten(), ops.Linear(12, width), ops.ReLU(), ops.Linear(width, 3))

    tiny.input_shape = (3, 4)
    registry.models.register("tiny", tiny)
    yield "tiny"
    registry.models.unregister("tiny")


def test_registered_model_uses_builder_shape_and_trainer_defaults(tiny_model, capsys):
    assert main(["mem-profile", "--model", tiny_model, "--batch-size", "5"]) == 0
    out = capsys.readouterr().out
    assert "samples of shape (3, 4) (from the model builder's input_shape)" in out
    assert "loss CrossEntropy, optimizer AdamW; batch 5 × accumulation 1" in out
    assert "memory plan for batch 5" in out
    assert main(["mem-profile", tiny_model, "--input-shape", "12", "--batch-size", "5"]) == 0
    assert "samples of shape (12,) (from --input-shape)" in capsys.readouterr().out


def test_registered_vision_models(capsys):
    pytest.importorskip("neuroflow_ops_vision")
    if getattr(registry.models.get("resnet18"), "input_shape", None) is None:
        assert main(["mem-profile", "resnet18", "--batch-size", "2"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "cannot tell the input shape of model 'resnet18'; pass --input-shape" in err
    assert main(["mem-profile", "resnet18", "--input-shape", "3,32,32", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "11,173,962 parameters" in out and "layer4.1.conv2 Conv2d" in out
    # 1 MiB holds not even the CNN's parameters, gradients and AdamW state: the report says so, and the exit status
    assert main(["mem-profile", "neuroflow_cnn", "--input-shape", "1,28,28", "--batch-size", "4", "--budget-mb", "1"]) == 1
    out = capsys.readouterr().out
    assert "Conv2d(1→48" in out and "largest batch that fits: 0" in out
    assert re.search(r"nothing fits: the budget of 1.000 MiB does not hold even the part that does not depend on the "
                     r"batch: parameters, gradients and optimizer state take 1.1\d\d MiB", out)


@pytest.mark.parametrize("argv, message", [
    (["mem-profile", "no_such_model"], "unknown model 'no_such_model'"),
    (["mem-profile", "missing.toml"], "config file 'missing.toml' not found"),
    (["mem-profile", str(EXAMPLE), "--input-shape", "785"],
     "the model does not take samples of shape (785,) (from --input-shape): "),
    (["mem-profile", str(EXAMPLE), "--model", str(EXAMPLE)], "give the model once"),
    (["mem-profile"], "give the model once"),
])
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("neuroflow: error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("flag, value", [("--input-shape", "3,x"), ("--input-shape", "3,0"), ("--budget-mb", "0"),
                                         ("--batch-size", "-1")])
def test_bad_arguments_exit_2_with_usage(flag, value, capsys):
    assert main(["mem-profile", str(EXAMPLE), flag, value]) == 2
    assert "usage: neuroflow mem-profile" in capsys.readouterr().err


def test_png_heatmap(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "mem.png"
    assert main(["mem-profile", str(EXAMPLE), "--png", str(path)]) == 0
    assert f"heat-map written to {path}" in capsys.readouterr().out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib_fails_before_profiling(tmp_path, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(command.importlib.util, "find_spec",
                        lambda name, *args: None if name == "matplotlib" else real(name, *args))
    assert main(["mem-profile", str(EXAMPLE), "--png", str(tmp_path / "mem.png")]) == 2
    captured = capsys.readouterr()
    assert "--png needs matplotlib, which is not installed: pip install matplotlib" in captured.err
    assert captured.out == "" and not (tmp_path / "mem.png").exists()


# ---------------------------------------------------------------- train under a budget
BUDGET_CONFIG = """
batch_size = 256
epochs = 2
seed = 0
memory_budget_mb = {budget}

[model]
layers = [
    {{ type = "Linear", in_features = 8, out_features = 4096 }},
    {{ type = "ReLU" }},
    {{ type = "Linear", in_features = 4096, out_features = 64 }},
    {{ type = "ReLU" }},
    {{ type = "Linear", in_features = 64, out_features = 4 }},
]

[data]
train = "train.npz"
"""


NUMPY_DATA = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)
# The data set, its batches and the seeded global generator are not the training step: no budget covers them.
NOT_BUDGETED = [tracemalloc.Filter(False, "*/neuroflow/data/*", all_frames=True),
                tracemalloc.Filter(False, "*/numpy/lib/_npyio_impl.py", all_frames=True),
                tracemalloc.Filter(False, "*/neuroflow/random.py", all_frames=True)]


class SteadyStatePeak:
    """A plugin measuring a training run with tracemalloc.

    ``held``: numpy data the run holds after the first (planning) step, the
    data pipeline left out. ``rise``: how far tracemalloc's peak over the
    later steps climbs above the traced memory at the end of step 1, counting
    everything (batches in flight included, so it is an upper bound).
    """

    def __init__(self) -> None:
        self.held = self.rise = self.steps = self._after_first = 0

    @hookimpl
    def neuroflow_step_end(self, trainer, step, loss):
        self.steps = step
        if step == 1:
            snapshot = tracemalloc.take_snapshot().filter_traces([NUMPY_DATA]).filter_traces(NOT_BUDGETED)
            self.held = sum(trace.size for trace in snapshot.traces)
            tracemalloc.reset_peak()
            self._after_first = tracemalloc.get_traced_memory()[0]

    @hookimpl
    def neuroflow_train_end(self, trainer, history):
        self.rise = tracemalloc.get_traced_memory()[1] - self._after_first


def test_train_with_a_budget_says_what_it_chose_and_stays_under_it(tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "train.npz", x=rng.standard_normal((512, 8)).astype(np.float32), y=rng.integers(0, 4, 512))
    layers = [ops.Linear(8, 4096), ops.ReLU(), ops.Linear(4096, 64), ops.ReLU(), ops.Linear(64, 4)]
    # room for batch 128 × accumulation 2 (and the input pipeline's few KiB), not for batch 256 at once
    fits_128x2 = 1.02 * nf.memory.profile(nf.Sequential(*layers), (128, 8), optimizer=nf.optim.AdamW(),
                                          gradient_accumulation_steps=2).predicted_peak_bytes
    path = tmp_path / "budget.toml"
    path.write_text(BUDGET_CONFIG.format(budget=f"{fits_128x2 / MiB:.6f}"))
    budget = int(float(f"{fits_128x2 / MiB:.6f}") * MiB)

    probe = SteadyStatePeak()
    plugin_manager().register(probe)
    tracemalloc.start(4)  # frames enough to see that np.load ran under the data pipeline
    try:
        assert main(["train", str(path)]) == 0
    finally:
        tracemalloc.stop()
        plugin_manager().unregister(probe)
    out = capsys.readouterr().out
    chosen = re.search(r"memory budget [\d.]+ MiB: batch 256 × accumulation 1 needs [\d.]+ MiB; "
                       r"using batch (\d+) × accumulation (\d+)", out)
    assert chosen, out
    batch, steps = int(chosen[1]), int(chosen[2])
    assert batch < 256 and batch * steps == 256
    assert probe.steps == 4  # 2 epochs of 2 optimisation steps: 3 steady-state steps measured
    # The arena takes what the budget leaves after parameters, gradients, optimizer state and the input
    # pipeline's batches; steady-state steps add only those batches and Python objects.
    assert probe.held <= budget
    assert probe.held + probe.rise <= budget * 1.01
