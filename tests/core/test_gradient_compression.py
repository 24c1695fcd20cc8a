"""Sparse gradient compression: exact error feedback, top-k/threshold/auto selection, arguments, memory, MNIST."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.buffers.flat import FlatParameters
from neuroflow.config import Config
from neuroflow.errors import ConfigError
from neuroflow.memory.compression import GradientCompressor, compression_nbytes
from neuroflow.tensor import Tensor


def _flat(*sizes, dtype=np.float64):
    return FlatParameters([Tensor(np.zeros(n, dtype=dtype), requires_grad=True) for n in sizes], np)


def _mlp(seed=0):
    nf.manual_seed(seed)
    return nf.Sequential(ops.Linear(6, 16), ops.Tanh(), ops.Linear(16, 3))


def _blobs(n=64, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    return (rng.standard_normal((n, 6)) + y[:, None]).astype(np.float32), y


def _numpy_allocations(run):
    """Numpy allocation sites whose live memory grew while ``run`` ran."""
    tracemalloc.start()
    try:
        domain = [tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)]
        before = tracemalloc.take_snapshot().filter_traces(domain)
        run()
        after = tracemalloc.take_snapshot().filter_traces(domain)
    finally:
        tracemalloc.stop()
    return [s for s in after.compare_to(before, "traceback") if s.size_diff > 0]


# ------------------------------------------------------------------ error feedback
@pytest.mark.parametrize("mode, kwargs", [("topk", {"ratio": 0.1}), ("threshold", {"threshold": 0.8}), ("auto", {})])
def test_error_feedback_is_exact(mode, kwargs):
    flat = _flat(50, 7, 200)
    compressor = GradientCompressor(mode, **kwargs)
    compressor.bind(flat)
    rng = np.random.default_rng(0)
    dense_sum = np.zeros(flat.size)
    sent_sum = np.zeros(flat.size)
    for _ in range(20):
        grad = rng.standard_normal(flat.size) * rng.choice([0.0, 0.1, 3.0], flat.size)
        pending = compressor.residual + grad
        flat.grad[:] = grad
        compressor.compress(flat.grad)
        # each entry went whole to the update or to the residual: bit for bit, nothing lost
        np.testing.assert_array_equal(flat.grad + compressor.residual, pending)
        assert not np.any((flat.grad != 0) & (compressor.residual != 0))
        dense_sum += grad
        sent_sum += flat.grad
    assert np.count_nonzero(compressor.residual) > 0  # something was held back: the test is not vacuous
    np.testing.assert_allclose(sent_sum + compressor.residual, dense_sum, rtol=0, atol=1e-12)


def test_error_feedback_is_exact_inside_the_trainer():
    x, y = _blobs(96)
    trainer = nf.Trainer(_mlp(), optimizer=nf.optim.AdamW(lr=0.01), batch_size=8, gradient_accumulation_steps=3,
                         gradient_compression="topk", compression_ratio=0.2, progress=False)
    compressor = trainer.compressor
    dense, sent = [], []
    original = compressor.compress

    def recording(grad):
        dense.append(grad.copy())
        stats = original(grad)
        sent.append(grad.copy())
        return stats

    compressor.compress = recording
    trainer.fit((x, y), epochs=2)
    assert len(dense) == trainer.step == 8
    np.testing.assert_allclose(np.sum(sent, axis=0) + compressor.residual, np.sum(dense, axis=0), rtol=1e-5, atol=1e-6)
    # the optimizer saw only the update: at most ceil(20 %) of each layer, ties aside
    flat = trainer.flat_parameters
    for view, stat in zip(flat.slices, compressor.last_stats):
        size = view.stop - view.start
        assert stat.sent == np.count_nonzero(flat.grad[view]) <= math.ceil(0.2 * size)
    assert [s.name for s in compressor.last_stats] == [n for n, _ in trainer.model.named_parameters()]


# ------------------------------------------------------------------ selection
def test_topk_sends_the_k_largest_magnitudes_of_each_layer():
    flat = _flat(10, 4)
    compressor = GradientCompressor("topk", ratio=0.25)
    compressor.bind(flat)
    first = np.array([0.1, -9.0, 0.3, 4.0, -0.2, 0.0, 5.0, -0.4, 0.5, 0.6])
    second = np.array([1.0, -3.0, 2.0, 0.5])
    flat.grad[:] = np.concatenate([first, second])
    stats = compressor.compress(flat.grad)
    # ceil(0.25 * 10) = 3 entries of the first layer, ceil(0.25 * 4) = 1 of the second
    np.testing.assert_array_equal(np.flatnonzero(flat.grad[:10]), [1, 3, 6])
    np.testing.assert_array_equal(flat.grad[10:], [0, -3.0, 0, 0])
    assert [(s.mode, s.sent) for s in stats] == [("sparse", 3), ("sparse", 1)]
    np.testing.assert_array_equal(compressor.residual[:10], np.where(np.isin(np.arange(10), [1, 3, 6]), 0, first))
    # the held-back entries grow with the next gradient until they are sent
    flat.grad[:] = np.concatenate([np.zeros(10), [2.0, 0.0, 0.0, 0.0]])
    compressor.compress(flat.grad)
    np.testing.assert_array_equal(flat.grad[10:], [3.0, 0, 0, 0])  # 1.0 held back + 2.0 now
    np.testing.assert_array_equal(compressor.residual[10:], [0, 0, 2.0, 0.5])


def test_threshold_sends_entries_at_or_above_the_threshold():
    flat = _flat(6)
    compressor = GradientCompressor("threshold", threshold=1.0)
    compressor.bind(flat)
    flat.grad[:] = [0.5, -1.0, 2.0, -0.99, 0.0, 0.7]
    compressor.compress(flat.grad)
    np.testing.assert_array_equal(flat.grad, [0, -1.0, 2.0, 0, 0, 0])
    flat.grad[:] = [0.5, 0.0, 0.0, 0.0, 0.0, 0.0]
    compressor.compress(flat.grad)
    np.testing.assert_array_equal(flat.grad, [1.0, 0, 0, 0, 0, 0])  # 0.5 + 0.5 held back reaches it
    np.testing.assert_array_equal(compressor.residual, [0, 0, 0, -0.99, 0, 0.7])


def test_auto_switches_each_layer_by_its_measured_sparsity():
    flat = _flat(100, 100)
    compressor = GradientCompressor("auto", ratio=0.1)
    compressor.bind(flat, ["sparse_first", "sparse_second"])
    rng = np.random.default_rng(1)
    concentrated = np.zeros(100)
    concentrated[rng.choice(100, 5, replace=False)] = rng.standard_normal(5) * 10
    concentrated += rng.standard_normal(100) * 1e-3  # nearly all the energy in 5 entries
    spread = rng.uniform(0.5, 1.0, 100) * rng.choice([-1.0, 1.0], 100)  # every entry matters
    flat.grad[:] = np.concatenate([concentrated, spread])
    first = compressor.compress(flat.grad)
    assert [s.mode for s in first] == ["sparse", "dense"]
    assert first[0].energy > 0.99 and first[1].energy < 0.2
    assert first[0].sent == 10
    np.testing.assert_array_equal(flat.grad[100:], spread)  # the dense layer sends everything ...
    assert not np.any(compressor.residual[100:])  # ... and holds nothing back
    assert np.count_nonzero(compressor.residual[:100]) == 90
    # the gradients trade places: so do the modes; the layer turned dense flushes its residual
    held_back = compressor.residual[:100].copy()
    flat.grad[:] = np.concatenate([spread, concentrated])
    second = compressor.compress(flat.grad)
    assert [s.mode for s in second] == ["dense", "sparse"]
    np.testing.assert_array_equal(flat.grad[:100], held_back + spread)
    assert not np.any(compressor.residual[:100])


def test_compression_works_without_accumulation():
    # decided: allowed. The residual carries unsent entries from step to step, so nothing needs micro-batches
    x, y = _blobs(32)
    trainer = nf.Trainer(_mlp(), batch_size=32, gradient_compression="topk", compression_ratio=0.1, progress=False)
    losses = [trainer.train_step(x, y) for _ in range(30)]
    assert losses[-1] < losses[0]
    flat = trainer.flat_parameters
    assert np.count_nonzero(flat.grad) == sum(s.sent for s in trainer.compressor.last_stats)
    assert sum(s.sent for s in trainer.compressor.last_stats) <= sum(math.ceil(0.1 * n) for n in flat.sizes)
    assert np.count_nonzero(trainer.compressor.residual) > flat.size // 2


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gradient_compression": "topK"}, "unknown gradient_compression 'topK'; choose one of 'topk', 'threshold'"),
        ({"gradient_compression": "topk", "compression_ratio": 0.0}, r"compression_ratio must be in \(0, 1\]"),
        ({"gradient_compression": "auto", "compression_ratio": 1.5}, r"compression_ratio must be in \(0, 1\], the fraction .*; got 1.5"),
        ({"gradient_compression": "topk", "compression_ratio": "10%"}, r"compression_ratio must be a number or None; got '10%' \(str\)"),
        ({"gradient_compression": "threshold"}, "'threshold' needs compression_threshold"),
        ({"gradient_compression": "threshold", "compression_threshold": -1e-3}, "must be a finite number > 0"),
        ({"gradient_compression": "threshold", "compression_threshold": 1e-3, "compression_ratio": 0.1},
         "compression_ratio applies to gradient_compression 'topk' and 'auto'"),
        ({"gradient_compression": "topk", "compression_threshold": 1e-3}, "set compression_ratio instead"),
        ({"compression_ratio": 0.1}, "need gradient_compression"),
        ({"gradient_compression": GradientCompressor("topk"), "compression_ratio": 0.1}, "carries its own settings"),
    ],
)
def test_bad_compression_arguments(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        nf.Trainer(_mlp(), **kwargs)


def test_compression_is_off_by_default_and_set_from_the_config_file():
    assert nf.Trainer(_mlp(), progress=False).compressor is None
    config = Config.from_dict({"gradient_compression": "threshold", "compression_threshold": 0.01,
                               "gradient_accumulation_steps": 2, "model": {"layers": [
                                   {"type": "Linear", "in_features": 6, "out_features": 3}]}})
    trainer = config.build_trainer(config.build_model())
    assert (trainer.compressor.mode, trainer.compressor.threshold) == ("threshold", 0.01)
    bad = Config.from_dict({"gradient_compression": "top-k", "model": {"layers": [
        {"type": "Linear", "in_features": 6, "out_features": 3}]}})
    with pytest.raises(ConfigError, match="unknown gradient_compression 'top-k'"):
        bad.build_trainer(bad.build_model())
    with pytest.raises(ConfigError, match="'compression_ratio' must be a number"):
        Config.from_dict({"compression_ratio": "0.1", "model": {"name": "mlp"}})


# ------------------------------------------------------------------ memory and bytes
def test_compression_memory_is_what_the_profile_predicts():
    model = _mlp()
    sizes = [p.data.size for p in model.parameters()]
    expected = compression_nbytes(sizes, 4)
    assert expected == sum(sizes) * 4  # the residual; the selection reuses the gradient buffer as scratch
    trainer = nf.Trainer(model, batch_size=8, gradient_accumulation_steps=2, gradient_compression="auto",
                         progress=False)
    flat = trainer.flat_parameters
    trainer.compressor.residual = None
    grown = _numpy_allocations(lambda: trainer.compressor.bind(flat))
    assert sum(s.size_diff for s in grown) == trainer.compressor.nbytes == expected
    dense = nf.memory.profile(model, (8, 6), gradient_accumulation_steps=2)
    compressed = nf.memory.profile(model, (8, 6), gradient_accumulation_steps=2, gradient_compression="auto")
    assert compressed.compression_bytes == expected
    assert compressed.static_bytes - dense.static_bytes == expected
    assert "gradient compression (error-feedback residual)" in str(compressed)
    with pytest.raises(ConfigError, match="unknown gradient_compression 'sparse'"):
        nf.memory.profile(model, (8, 6), gradient_compression="sparse")


def test_sent_bytes_are_the_packed_update():
    flat = _flat(1000, 10, dtype=np.float32)
    compressor = GradientCompressor("auto", ratio=0.05)
    compressor.bind(flat)
    grad = np.zeros(flat.size, dtype=np.float32)
    grad[:1000:40] = 5.0  # 25 large entries: a sparse layer
    grad[1000:] = 1.0  # a flat bias: dense
    flat.grad[:] = grad
    compressor.compress(flat.grad)
    packed = compressor.packed(flat.grad)
    assert [(name, None if index is None else index.dtype) for name, index, _ in packed] == [
        ("param0", np.dtype(np.int32)), ("param1", None)]
    on_the_wire = sum(v.nbytes + (0 if i is None else i.nbytes) for _, i, v in packed)
    assert compressor.sent_bytes(4) == on_the_wire == 25 * 8 + 10 * 4
    rebuilt = np.zeros(flat.size, dtype=np.float32)
    rebuilt[packed[0][1]] = packed[0][2]
    rebuilt[1000:] = packed[1][2]
    np.testing.assert_array_equal(rebuilt, flat.grad)


def test_steady_state_compressed_step_keeps_no_new_arrays():
    x, y = _blobs(64)
    trainer = nf.Trainer(_mlp(), batch_size=16, gradient_accumulation_steps=4, gradient_compression="auto",
                         progress=False)
    trainer.train_step(x, y)
    trainer.train_step(x, y)

    def steps():
        for _ in range(3):
            trainer.train_step(x, y)

    assert [s for s in _numpy_allocations(steps) if s.count_diff > 0 and s.size_diff > 256] == []


# ------------------------------------------------------------------ real data
def test_topk_at_ten_percent_keeps_mnist_accuracy_near_dense():
    train, test = nf.data.mnist("train", normalize=True), nf.data.mnist("test", normalize=True)
    steps = 600  # 0.64 epoch of effective batch 64; measured: dense 95.1 %, top-k 10 % 94.8 %, top-k 1 % 92.9 %
    x, y = train[np.arange(steps * 64)]
    accuracy, sent = {}, {}
    for mode in (None, "topk"):
        nf.manual_seed(0)
        model = nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10))
        # a cosine decay to zero, so the end point is not one noisy step of a constant learning rate
        scheduler = nf.schedulers.Cosine()
        trainer = nf.Trainer(model, optimizer=nf.optim.AdamW(lr=2e-3), scheduler=scheduler, batch_size=16,
                             gradient_accumulation_steps=4, gradient_compression=mode,
                             compression_ratio=0.1 if mode else None, progress=False)
        scheduler.bind(trainer.optimizer.lr, steps, steps)
        total = 0
        for s in range(steps):
            trainer.train_step(x[s * 64:(s + 1) * 64], y[s * 64:(s + 1) * 64])
            total += trainer.compressor.sent_bytes(4) if mode else trainer.flat_parameters.size * 4
        accuracy[mode], sent[mode] = trainer.evaluate(test)["accuracy"], total / steps
    assert accuracy[None] > 0.945
    assert accuracy["topk"] >= accuracy[None] - 0.01
    assert sent["topk"] <= 0.21 * sent[None]  # a tenth of the entries, 8 bytes each instead of 4


def test_memory_budget_counts_the_residual():
    x, _ = _blobs()
    reports = {}
    for mode in (None, "topk"):
        trainer = nf.Trainer(_mlp(), optimizer=nf.optim.SGD(lr=0.1), batch_size=16, memory_budget_mb=64,
                             gradient_compression=mode, progress=False)
        reports[mode] = trainer.fit_to_budget(tuple(x.shape[1:]))
    flat_bytes = sum(p.nbytes for p in _mlp().parameters())
    assert reports["topk"].static_bytes - reports[None].static_bytes == flat_bytes
