"""Trainer: accumulation equals the large batch, determinism, stopping, errors, real MNIST convergence."""

from __future__ import annotations

import signal
import tracemalloc

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.errors import ConfigError, NonFiniteDataError, NonFiniteLossError
from neuroflow.hookspecs import hookimpl
from neuroflow.plugins import plugin_manager


def _mlp(seed=0, dropout=0.0):
    nf.manual_seed(seed)
    layers = [ops.Linear(6, 16), ops.Tanh()]
    if dropout:
        layers.append(ops.Dropout(dropout))
    return nf.Sequential(*layers, ops.Linear(16, 3))


def _blobs(n=64, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (rng.standard_normal((n, 6)) + y[:, None]).astype(np.float32)
    return x, y


def _weights(model):
    return [p.data.copy() for p in model.parameters()]


@pytest.mark.parametrize("optimizer", [lambda: nf.optim.SGD(lr=0.1), lambda: nf.optim.AdamW(lr=0.01)])
def test_gradient_accumulation_gives_the_large_batch_update(optimizer):
    x, y = _blobs(24)
    big = nf.Trainer(_mlp(), optimizer=optimizer(), batch_size=24, progress=False)
    small = nf.Trainer(_mlp(), optimizer=optimizer(), batch_size=8, gradient_accumulation_steps=3, progress=False)
    big.fit((x, y), epochs=2)
    small.fit((x, y), epochs=2)
    assert big.step == small.step == 2
    for a, b in zip(_weights(big.model), _weights(small.model)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    # train_step splits one batch into micro-batches with the same result
    one = nf.Trainer(_mlp(), optimizer=optimizer(), batch_size=24, gradient_accumulation_steps=5, progress=False)
    whole = nf.Trainer(_mlp(), optimizer=optimizer(), batch_size=24, progress=False)
    la, lb = one.train_step(x, y), whole.train_step(x, y)
    assert la == pytest.approx(lb, rel=1e-5)
    for a, b in zip(_weights(one.model), _weights(whole.model)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)


def test_training_is_deterministic_for_a_seed():
    x, y = _blobs(96)
    runs = []
    for _ in range(2):
        trainer = nf.Trainer(_mlp(dropout=0.2), batch_size=16, seed=3, progress=False)
        history = trainer.fit((x, y), epochs=2)
        runs.append((_weights(trainer.model), history["loss"]))
    assert runs[0][1] == runs[1][1]
    for a, b in zip(runs[0][0], runs[1][0]):
        np.testing.assert_array_equal(a, b)


def test_fit_learns_and_reports_metrics_evaluate_and_predict():
    x, y = _blobs(256)
    trainer = nf.Trainer(_mlp(), optimizer=nf.optim.Adam(lr=0.02), batch_size=32, progress=False,
                         scheduler=nf.schedulers.Cosine(warmup_epochs=1))
    history = trainer.fit((x, y), epochs=4, val_data=(x, y))
    assert history["loss"][-1] < history["loss"][0]
    assert history[-1]["accuracy"] > 0.8 and history[-1]["val_accuracy"] > 0.8
    assert set(history[-1]) >= {"epoch", "loss", "accuracy", "val_loss", "val_accuracy", "lr", "time_s"}
    metrics = trainer.evaluate((x, y))
    assert metrics["accuracy"] == pytest.approx(history[-1]["val_accuracy"])
    probs = trainer.predict(x[:50])
    assert probs.shape == (50, 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert (probs.argmax(1) == y[:50]).mean() >= 0.75
    with pytest.raises(KeyError, match="no metric 'f1'"):
        history["f1"]


def test_nonfinite_loss_stops_with_step_and_layer():
    x, y = _blobs(32)
    trainer = nf.Trainer(_mlp(), optimizer=nf.optim.SGD(lr=0.1), batch_size=8, progress=False)
    trainer.fit((x, y), epochs=1)
    trainer.model[2].weight.data[0, 0] = np.nan
    with pytest.raises(NonFiniteLossError, match=r"at step 5 \(first non-finite output in layer 2 \(Linear\(16→3\)\)\); "
                                                 r"training stopped. The batch's data are finite") as info:
        trainer.fit((x, y), epochs=1)
    assert not isinstance(info.value, NonFiniteDataError)


def test_interrupt_stops_cleanly_after_the_current_step():
    class InterruptAtStep3:
        @hookimpl
        def neuroflow_step_end(self, trainer, step):
            if step == 3:
                signal.raise_signal(signal.SIGINT)

    plugin = InterruptAtStep3()
    plugin_manager().register(plugin)
    before = signal.getsignal(signal.SIGINT)  # default_int_handler (tests/conftest.py sees to it)
    try:
        x, y = _blobs(64)
        trainer = nf.Trainer(_mlp(), batch_size=8, progress=False)
        history = trainer.fit((x, y), epochs=3)
    finally:
        plugin_manager().unregister(plugin)
    assert trainer.step == 3 and history.interrupted and len(history) == 1
    assert signal.getsignal(signal.SIGINT) is before  # the handler the trainer found is back


def test_gradient_clipping_bounds_the_global_norm():
    x, y = _blobs(16)
    trainer = nf.Trainer(_mlp(), optimizer=nf.optim.SGD(lr=0.0001), batch_size=16, clip_grad_norm=0.01, progress=False)
    trainer.train_step(x * 100, y)
    assert trainer.last_grad_norm > 0.01
    assert float(np.linalg.norm(trainer.flat_parameters.grad)) == pytest.approx(0.01, rel=1e-4)


def test_steady_state_training_step_allocates_no_arrays():
    x, y = _blobs(64)
    model = nf.Sequential(ops.Linear(6, 32), ops.GELU(), ops.Dropout(0.1), ops.Linear(32, 16), ops.ReLU(), ops.Linear(16, 3))
    trainer = nf.Trainer(model, optimizer=nf.optim.AdamW(lr=1e-3), batch_size=64, progress=False)
    trainer.train_step(x, y)
    trainer.train_step(x, y)
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)])
        for _ in range(3):
            trainer.train_step(x, y)
        after = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)])
    finally:
        tracemalloc.stop()
    grown = [s for s in after.compare_to(before, "traceback") if s.count_diff > 0 and s.size_diff > 256]
    assert grown == []


def test_outputs_of_a_trained_model_are_the_callers_to_keep():
    """Between trainer calls the model runs without the trainer's buffers: an output kept in a list is not
    overwritten by the next forward (inside a step, outputs are planned buffers that the next step reuses)."""
    x, y = _blobs(64)
    model = _mlp()
    trainer = nf.Trainer(model, batch_size=32, progress=False)
    trainer.fit((x, y), epochs=2)
    trainer.evaluate((x, y))
    model.eval()
    kept = [model.forward(x[i:i + 16]) for i in range(0, 64, 16)]
    np.testing.assert_array_equal(np.concatenate(kept), model.forward(x))
    np.testing.assert_array_equal(trainer.predict(x).argmax(axis=1), model.forward(x).argmax(axis=1))
    before = [o.copy() for o in kept]
    trainer.train_step(x[:32], y[:32])  # the trainer takes its buffers back for the step, then returns them
    for a, b in zip(kept, before):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be a positive integer"),
        ({"clip_grad_norm": -1.0}, "clip_grad_norm must be a positive finite number; got -1.0"),
        # what the type hints say, exactly: a bool is not an int, a string is not a number
        ({"batch_size": True}, r"batch_size must be an integer; got True \(bool\)"),
        ({"keep_checkpoints": False}, r"keep_checkpoints must be an integer; got False \(bool\)"),
        ({"checkpoint_dir": "x", "checkpoint_every": True}, r"checkpoint_every must be an integer or None; got True"),
        ({"seed": 1.5}, r"seed must be an integer or None; got 1.5 \(float\)"),
        ({"clip_grad_norm": "1.0"}, r"clip_grad_norm must be a number or None; got '1.0' \(str\)"),
        ({"memory_budget_mb": "64"}, r"memory_budget_mb must be a number or None; got '64' \(str\)"),
        ({"memory_budget_mb": float("inf")}, "memory_budget_mb must be a positive finite number; got inf"),
        ({"shuffle": "no"}, r"shuffle must be True or False; got 'no' \(str\)"),
        ({"checkpoint_dir": 3}, r"checkpoint_dir must be a string or a path or None; got 3 \(int\)"),
    ],
)
def test_bad_trainer_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        nf.Trainer(_mlp(), **kwargs)


def test_numbers_where_the_hint_says_float_and_paths_where_it_says_pathlike(tmp_path):
    trainer = nf.Trainer(_mlp(), clip_grad_norm=1, memory_pool_size_mb=np.float32(8.0), checkpoint_dir=tmp_path,
                         progress=False)
    assert trainer.options.clip_grad_norm == 1 and trainer.checkpoint_dir == tmp_path


def test_non_finite_inputs_are_blamed_on_the_data_with_the_step_and_the_sample():
    x, y = _blobs(32)
    x[13, 2] = np.nan  # the batch of step 2 (batches of 8, in order), its sample 5
    x[14, 0] = np.inf
    trainer = nf.Trainer(_mlp(), batch_size=8, shuffle=False, progress=False)
    with pytest.raises(NonFiniteDataError, match=r"loss became nan at step 2 because the training inputs hold "
                                                 r"NaN/Inf: 2 value\(s\), in sample\(s\) 5, 6 of the batch") as info:
        trainer.fit((x, y), epochs=1)
    error = info.value
    assert isinstance(error, NonFiniteLossError) and error.layer is None  # not layer 0's fault
    assert (error.step, error.which, error.samples, error.count) == (2, "inputs", [5, 6], 2)
    assert trainer.step == 1


def test_non_finite_inputs_of_one_micro_batch_and_non_finite_targets_are_named():
    x, y = _blobs(16)
    x[11, 0] = np.nan  # the step's second micro-batch of 8, its sample 3
    trainer = nf.Trainer(_mlp(), batch_size=8, gradient_accumulation_steps=2, progress=False)
    with pytest.raises(NonFiniteDataError, match=r"in sample\(s\) 3 of micro-batch 1 of 2") as info:
        trainer.train_step(x, y)
    assert (info.value.micro_batch, info.value.micro_batches) == (1, 2)
    targets = np.zeros((16, 3), dtype=np.float32)
    targets[4, 1] = np.nan
    regression = nf.Trainer(_mlp(), loss=nf.losses.MSE(), batch_size=16, progress=False)
    with pytest.raises(NonFiniteDataError, match="the training targets hold NaN/Inf") as info:
        regression.train_step(_blobs(16)[0], targets)
    assert (info.value.which, info.value.samples) == ("targets", [4])


def test_bad_calls():
    trainer = nf.Trainer(_mlp(), progress=False)
    x, y = _blobs(8)
    with pytest.raises(ConfigError, match="8 inputs and 7 targets"):
        trainer.train_step(x, y[:7])
    with pytest.raises(ConfigError, match="epochs must be a positive integer"):
        trainer.fit((x, y), epochs=0)
    with pytest.raises(TypeError, match="needs an Operator model"):
        nf.Trainer("model")


@pytest.mark.slow
def test_mlp_reaches_97_percent_on_real_mnist_in_two_epochs():
    train, test = nf.data.mnist("train", normalize=True), nf.data.mnist("test", normalize=True)
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10))
    trainer = nf.Trainer(model, optimizer=nf.optim.AdamW(lr=2e-3), scheduler=nf.schedulers.Cosine(),
                         batch_size=64, seed=0, progress=False)
    trainer.fit(train, epochs=2)
    assert trainer.evaluate(test)["accuracy"] >= 0.97


def test_augment_applies_to_training_batches_only():
    x, y = _blobs(32)
    seen = []

    def flip_sign(batch):
        seen.append(batch.shape)
        return -batch

    trainer = nf.Trainer(_mlp(), batch_size=8, progress=False, augment=flip_sign)
    trainer.fit((x, y), epochs=1, val_data=(x, y))
    assert seen == [(8, 6)] * 4  # four training batches; validation and evaluate are not augmented
    trainer.evaluate((x, y))
    assert len(seen) == 4
    with pytest.raises(ConfigError, match="augment must be callable"):
        nf.Trainer(_mlp(), augment="flip")


# ---------------------------------------------------------------- options
def test_keyword_settings_and_an_options_object_build_the_same_trainer() -> None:
    from neuroflow.trainer import TrainerOptions

    x = np.random.default_rng(0).standard_normal((32, 6)).astype(np.float32)
    y = np.arange(32) % 3
    results = []
    for build in (lambda m: nf.Trainer(m, optimizer=nf.optim.SGD(lr=0.1), batch_size=8, seed=3, progress=False),
                  lambda m: nf.Trainer(m, optimizer=nf.optim.SGD(lr=0.1),
                                       options=TrainerOptions(batch_size=8, seed=3, progress=False))):
        nf.random.manual_seed(0)
        trainer = build(nf.Sequential(nf.ops.Linear(6, 3)))
        trainer.fit((x, y), epochs=2)
        results.append(trainer.model.state_dict())
        assert trainer.options.batch_size == trainer.batch_size == 8
    for name in results[0]:
        np.testing.assert_array_equal(results[0][name], results[1][name])


def test_unknown_settings_and_settings_given_twice_are_named() -> None:
    from neuroflow.trainer import TrainerOptions

    model = nf.Sequential(nf.ops.Linear(4, 2))
    with pytest.raises(TypeError, match=r"unknown argument\(s\) 'batchsize'; valid: .*batch_size"):
        nf.Trainer(model, batchsize=8)
    with pytest.raises(TypeError, match="options= or keyword settings, not both; got seed"):
        nf.Trainer(model, options=TrainerOptions(), seed=1)
    with pytest.raises(nf.errors.ConfigError, match="batch_size must be a positive integer; got 0"):
        TrainerOptions(batch_size=0)
