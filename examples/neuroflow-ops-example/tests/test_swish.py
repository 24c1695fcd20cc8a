# ruff: noqa: S101 - pytest tests assert (the repository ignores S101 only under tests/)
"""The checks NeuroFlow's own ops pass, from NeuroFlow's pytest plugin: no code copied from its repository."""

from __future__ import annotations

import numpy as np
from neuroflow_ops_example import Swish

import neuroflow as nf
from neuroflow import ops
from neuroflow.testing import OpTestCase


class TestSwish(OpTestCase):
    """Float64 gradcheck on cpu, and forward/backward parity on every installed backend (nf_backend)."""

    input_shapes = [(4, 7)]

    def make_op(self) -> Swish:
        return Swish(beta=0.8)


def test_gradcheck_of_input_and_beta(nf_gradcheck) -> None:
    nf_gradcheck(Swish(beta=1.3), [np.random.default_rng(0).standard_normal((3, 5))])


def test_beta_one_is_silu() -> None:
    x = np.linspace(-6, 6, 25, dtype=np.float32)
    np.testing.assert_allclose(Swish(beta=1.0).forward(x), x / (1 + np.exp(-x)), rtol=1e-6, atol=1e-7)


def test_found_by_name_through_the_entry_point() -> None:
    assert ops.Swish is Swish


def test_runs_on_every_installed_backend(nf_backend) -> None:
    x = np.random.default_rng(1).standard_normal((8, 3)).astype(np.float32)
    op = Swish().to(nf_backend)
    y = nf_backend.to_host(op.forward(nf_backend.from_host(x)))
    np.testing.assert_allclose(y, x / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)


def test_trains_and_round_trips_through_a_model_file(tmp_path) -> None:
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(4, 8), Swish(), ops.Linear(8, 1))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    y = (x[:, :1] ** 2).astype(np.float32)
    trainer = nf.Trainer(model, loss=nf.losses.MSE(), optimizer=nf.optim.Adam(lr=1e-2), batch_size=64,
                         progress=False)
    first = trainer.train_step(x, y)
    for _ in range(50):
        last = trainer.train_step(x, y)
    assert last < 0.5 * first
    assert float(model[1].beta.data[0]) != 1.0          # beta trained
    nf.save(model, tmp_path / "swish.safetensors")
    loaded = nf.load(tmp_path / "swish.safetensors")
    np.testing.assert_allclose(loaded.forward(x), model.forward(x), rtol=1e-6)
