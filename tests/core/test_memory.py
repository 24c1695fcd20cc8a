"""Memory runtime: planned buffers are correct, shared, predicted within 5 %, and allocate nothing after step 1."""

from __future__ import annotations

import re
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuroflow as nf
from neuroflow import ops
from neuroflow.allocators.arena import ArenaAllocator
from neuroflow.allocators.caching import CachingAllocator
from neuroflow.buffers.planner import max_live_bytes, place
from neuroflow.buffers.trace import Slot, TracingPool
from neuroflow.errors import OutOfMemoryError
from neuroflow.trainer import budget as budget_plan

NUMPY_DATA = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)


def mlp(depth=2, width=128, seed=0):
    nf.manual_seed(seed)
    layers = [ops.Linear(784, width), ops.ReLU()]
    for _ in range(depth - 1):
        layers += [ops.Linear(width, width), ops.ReLU()]
    return nf.Sequential(*layers, ops.Linear(width, 10))


def branchy(seed=0):
    nf.manual_seed(seed)
    block = nf.Sequential(ops.Linear(32, 32), ops.GELU(), ops.Dropout(0.2), ops.Linear(32, 32))
    return nf.Sequential(
        ops.Linear(20, 32), ops.Tanh(),
        nf.Residual(block),
        nf.Concat(ops.Linear(32, 8), nf.Sequential(ops.ReLU(), ops.Linear(32, 8)), axis=-1),
        nf.Residual(ops.Linear(16, 24), shortcut=ops.Linear(16, 24)),
        ops.Flatten(), ops.Linear(24, 5),
    )


def data(n, features, classes, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, features)).astype(np.float32), rng.integers(0, classes, n)


def train_planned_and_direct(make, x, y, optimizer):
    """Train ``make()`` for 3 epochs with the planned arena and with direct allocation; assert the weights are
    bit-identical (memory reused too early would change them) and return the arena's trainer."""
    runs, planned = [], None
    for allocator in ("arena", "direct"):
        trainer = nf.Trainer(make(), optimizer=optimizer(), batch_size=16, seed=1, allocator=allocator,
                             progress=False)
        trainer.fit((x, y), epochs=3)
        runs.append([p.data.copy() for p in trainer.model.parameters()])
        planned = planned or trainer
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    return planned


@pytest.mark.parametrize("make", [lambda: mlp(3), branchy])
def test_planned_arena_training_matches_unplanned_training_bit_for_bit(make):
    features = 784 if make().layers[0].in_features == 784 else 20
    x, y = data(48, features, 5)
    plan = train_planned_and_direct(make, x, y, lambda: nf.optim.AdamW(lr=1e-2)).memory.plan
    assert plan is not None and plan.arena_bytes < plan.unshared_bytes  # buffers really are shared


def nested_residuals(seed=0):
    nf.manual_seed(seed)
    inner = nf.Residual(nf.Sequential(ops.Linear(16, 16), ops.Tanh()))
    return nf.Sequential(
        ops.Linear(8, 16),
        nf.Residual(nf.Residual(inner)),
        nf.Residual(nf.Concat(ops.Linear(16, 8), nf.Sequential(ops.Tanh(), ops.Linear(16, 8)), axis=-1)),
        nf.Residual(nf.Sequential(ops.Linear(16, 16)), shortcut=ops.Linear(16, 16)),
        ops.Linear(16, 3),
    )


def test_traced_step_frees_no_gradient_that_a_composite_reads_again():
    """The tracer reuses a consumed gradient's memory at once, unless a composite kept it for a second read."""
    x, y = data(6, 8, 3)
    runs = []
    for tracer in (None, TracingPool(np)):
        model, loss = nested_residuals(), nf.losses.CrossEntropy()
        for p in model.parameters():
            p.grad = np.zeros_like(p.data)
        model.attach_pool(tracer)
        loss.attach_pool(tracer)
        loss.forward(model.forward(x), y)
        gx = model.backward(loss.backward())
        runs.append([p.grad.copy() for p in model.parameters()] + [gx.copy()])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_tracer_reuses_a_consumed_gradient_only_once_no_composite_keeps_it():
    pool, f32 = TracingPool(np), np.float32
    first, second, third = ops.ReLU(), ops.ReLU(), ops.ReLU()
    grad = pool.get(first, "gx", (16,), f32)
    pool.handoff(None, grad, first)  # handed out of first.backward
    pool.keep(grad)  # a residual reads it again
    pool.handoff(grad, None, second)  # consumed by the next layer
    assert not np.shares_memory(pool.get(second, "gx", (16,), f32), grad)
    pool.release(grad, kept=True)
    assert np.shares_memory(pool.get(third, "gx", (16,), f32), grad)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 40), st.integers(0, 15)), min_size=1, max_size=30))
def test_placement_never_overlaps_live_buffers(spec):
    slots = [Slot(None, f"k{i}", (n,), np.uint8, n, start, "forward", end=start + length)
             for i, (n, start, length) in enumerate(spec)]
    plan = place(slots)
    assert plan.arena_bytes >= max_live_bytes(slots)
    for i, a in enumerate(slots):
        for b in slots[i + 1:]:
            if a.start <= b.end and b.start <= a.end:
                assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset


def _measured_peak(make_model, batch, steps=3):
    """tracemalloc's numpy-data peak of steady-state steps, above what existed before the model."""
    x, y = data(batch, 784, 10)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        model = make_model()
        trainer = nf.Trainer(model, optimizer=nf.optim.Adam(lr=1e-3), batch_size=batch, progress=False)
        trainer.train_step(x, y)
        tracemalloc.reset_peak()
        for _ in range(steps):
            trainer.train_step(x, y)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak - base, trainer


@pytest.mark.parametrize("depth", [2, 6])
@pytest.mark.parametrize("batch", [32, 128, 512])
def test_predicted_peak_is_within_five_percent_of_measured(depth, batch):
    predicted = nf.memory.profile(mlp(depth), (batch, 784), optimizer=nf.optim.Adam(lr=1e-3)).predicted_peak_bytes
    measured, _ = _measured_peak(lambda: mlp(depth), batch)
    assert abs(predicted - measured) / measured <= 0.05, (predicted, measured)


def test_the_traced_steps_memory_is_released_before_its_optimizer_step(monkeypatch):
    """The first step's arrays are views of one reservation, so one left alive keeps all its pages resident:
    none may be alive when the optimizer allocates its state, or the first step's peak is the trace's and the
    optimizer's together."""
    import weakref

    reservations = []
    forget = TracingPool.forget

    def remember_the_reservation(self, modules):
        reservations.extend(weakref.ref(base) for base in self._bases)
        forget(self, modules)

    monkeypatch.setattr(TracingPool, "forget", remember_the_reservation)
    trainer = nf.Trainer(mlp(), nf.losses.CrossEntropy(), nf.optim.SGD(lr=0.1, momentum=0.9), batch_size=32,
                         progress=False, seed=0)
    alive_at_the_optimizer_step = []
    step = trainer.optimizer.step
    monkeypatch.setattr(trainer.optimizer, "step", lambda lr=None: (
        alive_at_the_optimizer_step.append(any(ref() is not None for ref in reservations)), step(lr))[-1])
    trainer.train_step(*data(32, 784, 10))
    assert reservations and alive_at_the_optimizer_step == [False]


def test_zero_grad_leaves_the_skipped_parameters_gradients_alone():
    from neuroflow.buffers.flat import FlatParameters
    from neuroflow.tensor import Tensor

    params = [Tensor(np.ones(n, np.float32), requires_grad=True) for n in (3, 4, 5, 6)]
    flat = FlatParameters(params, np)
    flat.grad[:] = 7
    flat.zero_grad({id(params[1]), id(params[2])})
    assert [p.grad.tolist() for p in params] == [[0] * 3, [7] * 4, [7] * 5, [0] * 6]
    flat.grad[:] = 7
    flat.zero_grad({id(params[0])})  # another set: ranges worked out again
    assert [p.grad.sum() for p in params] == [21, 0, 0, 0]
    flat.grad[:] = 7
    flat.zero_grad()
    assert not flat.grad.any()


# Run in a fresh interpreter: what glibc does with freed pages depends on the heap's history, which a long test
# session (the vision tests before this one, say) leaves in any state.
_PACKING_SCRIPT = """
import numpy as np
from neuroflow.buffers.flat import FlatParameters
from neuroflow.tensor import Tensor

def resident_mib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024

scratch = np.ones(2**21)  # 16 MiB, freed: glibc's mmap threshold rises to its size
del scratch
params = [Tensor(np.ones(2**16, np.float32), requires_grad=True) for _ in range(256)]  # 64 MiB on the heap
above = np.ones(2**16)  # alive above them (larger than any hole between them): glibc would trim a free top
before = resident_mib()
flat = FlatParameters(params, np)
assert flat.size == 2**24 and above.size == 2**16
print(resident_mib() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_packing_parameters_leaves_none_of_their_old_arrays_resident():
    """Once a large array has been freed, glibc serves the next ones from its heap and keeps their pages after
    they are freed: packing must hand them back, or a model's parameters stay resident twice over."""
    run = subprocess.run([sys.executable, "-c", _PACKING_SCRIPT], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert float(run.stdout.split()[-1]) < 32  # the packed copy (64 MiB) in, the 64 MiB of old arrays out


def test_steady_state_steps_make_no_allocations_and_counters_match_tracemalloc():
    x, y = data(64, 784, 10)
    trainer = nf.Trainer(mlp(2), batch_size=64, progress=False)
    tracemalloc.start()
    try:
        trainer.train_step(x, y)
        stats = trainer.memory_stats()
        snapshot = tracemalloc.take_snapshot().filter_traces([NUMPY_DATA])
        for _ in range(3):
            trainer.train_step(x, y)
        later = tracemalloc.take_snapshot().filter_traces([NUMPY_DATA])
    finally:
        tracemalloc.stop()
    assert trainer.memory_stats().allocations == stats.allocations == 1  # the arena itself, once
    assert [d for d in later.compare_to(snapshot, "lineno") if d.count_diff > 0 and d.size_diff > 256] == []
    arena_trace = [t for t in snapshot.traces if t.size == stats.pool_bytes]
    assert arena_trace, "the arena's block is visible to tracemalloc with exactly the size the counters report"
    assert stats.pool_bytes == trainer.memory.plan.arena_bytes + 64  # over-allocated by one alignment unit
    assert stats.in_use_bytes == trainer.memory.plan.arena_bytes


def test_budget_fits_batch_and_accumulation_and_training_stays_under_it(capsys):
    probe = nf.memory.profile(mlp(2, width=256), (96, 784), optimizer=nf.optim.Adam(lr=1e-3),
                              gradient_accumulation_steps=2)
    inputs = 4 * 96 * (784 * 4 + 8)  # the input pipeline's batches, which the Trainer keeps out of the budget
    budget = (probe.predicted_peak_bytes + inputs) / 2**20  # batch 96 with accumulation fits; 256 does not
    trainer = nf.Trainer(mlp(2, width=256), optimizer=nf.optim.Adam(lr=1e-3), batch_size=256,
                         memory_budget_mb=budget, progress=True)
    x, y = data(512, 784, 10)
    trainer.fit((x, y), epochs=1)
    said = capsys.readouterr().out
    assert "using batch" in said
    b, k = trainer.batch_size, trainer.gradient_accumulation_steps
    assert b < 256 and b * k >= 256 and k > 1
    assert trainer.memory_report.predicted_peak_bytes <= budget * 2**20
    measured, _ = _measured_peak(lambda: mlp(2, width=256), b)
    assert measured <= budget * 2**20 * 1.02


def _batch1(trainer, effective):
    """The profile the Trainer's budget check makes, at a generous budget: the static part and batch 1's peaks."""
    return budget_plan.profile_step(trainer.memory, effective, (784,), 1, 1e3)


def test_a_budget_below_batch_1_says_what_does_not_fit_with_both_parts_and_the_budget_that_does():
    x, y = data(64, 784, 10)
    probe = _batch1(nf.Trainer(mlp(2), batch_size=1, progress=False), 1)
    static, one = probe.static_bytes, probe.batch1_peak_bytes
    assert static < one
    budget = (static + one) / 2 / 2**20  # holds the parameters and optimizer state, not batch 1's activations
    with pytest.raises(OutOfMemoryError) as info:
        nf.Trainer(mlp(2), batch_size=1, memory_budget_mb=budget, progress=False).fit((x, y), epochs=1)
    message = str(info.value)
    assert re.search(rf"the budget of {budget:.3f} MiB is too small even for batch 1, which needs [\d.]+ MiB: "
                     rf"parameters, gradients and optimizer state take {static / 2**20:.3f} MiB; activations, "
                     rf"workspace and input batches at batch 1 take {(one - static) / 2**20:.3f} MiB more", message)
    enough = float(re.search(r"Raise the budget to at least ([\d.]+) MiB", message).group(1))
    needed = one / (1 - budget_plan.HOST_MARGIN)  # the Trainer keeps that share of any budget for host temporaries
    assert needed <= enough * 2**20 < needed + 2**20 / 1000
    trainer = nf.Trainer(mlp(2), batch_size=1, memory_budget_mb=enough, progress=False)
    trainer.fit((x[:4], y[:4]), epochs=1)  # the budget it names is enough
    assert trainer.batch_size == 1


def test_a_budget_below_the_static_part_says_so():
    x, y = data(64, 784, 10)
    probe = _batch1(nf.Trainer(mlp(2), batch_size=64, progress=False), 64)
    budget = probe.static_bytes / 2 / 2**20
    with pytest.raises(OutOfMemoryError, match=rf"the budget of {budget:.3f} MiB does not hold even the part that "
                                               rf"does not depend on the batch: parameters, gradients and optimizer "
                                               rf"state take {probe.static_bytes / 2**20:.3f} MiB"):
        nf.Trainer(mlp(2), batch_size=64, memory_budget_mb=budget, progress=False).fit((x, y), epochs=1)


def test_a_budget_that_fits_a_batch_but_no_accumulation_offers_that_batch_and_it_fits():
    """Accumulating needs a workspace per weight gradient: a budget between batch 1's peak without it and with it
    holds a batch of its own, which the error offers (it said "too small even for batch 1")."""
    x, y = data(256, 784, 10)
    probe = _batch1(nf.Trainer(mlp(2), batch_size=64, gradient_accumulation_steps=4, progress=False), 256)
    one, accumulating = probe.batch1_peak_bytes, probe.batch1_accumulating_peak_bytes
    assert one < accumulating
    budget = (one + 3 * accumulating) / 4 / (1 - budget_plan.HOST_MARGIN) / 2**20  # the Trainer keeps a margin
    with pytest.raises(OutOfMemoryError, match=r"no batch × accumulation keeps the effective batch 256 .* "
                                               r"batch_size=(\d+) with gradient_accumulation_steps=1 fits") as info:
        nf.Trainer(mlp(2), batch_size=64, gradient_accumulation_steps=4, memory_budget_mb=budget,
                   progress=False).fit((x, y), epochs=1)
    fits = int(re.search(r"batch_size=(\d+) with", str(info.value)).group(1))
    assert fits > 1
    trainer = nf.Trainer(mlp(2), batch_size=fits, memory_budget_mb=budget, progress=False)
    trainer.fit((x, y), epochs=1)
    assert (trainer.batch_size, trainer.gradient_accumulation_steps) == (fits, 1)
    # the largest: one more sample without accumulation does not fit (a Trainer asked for it splits it, since the
    # input a smaller effective batch holds is smaller)
    assert not budget_plan.profile_step(trainer.memory, fits + 1, (784,), 1, budget).fits()


def test_pool_too_small_raises_with_needed_free_and_advice():
    x, y = data(1024, 784, 10)
    trainer = nf.Trainer(mlp(2), batch_size=1024, memory_pool_size_mb=0.45, progress=False)
    with pytest.raises(OutOfMemoryError, match=r"needs an arena of \d+ bytes; the pool holds 471859 bytes\. batch_size=\d+ with gradient_accumulation_steps=\d+ would fit"):
        trainer.train_step(x, y)


def test_pool_too_small_for_accumulation_advises_the_largest_batch_that_fits_and_it_does():
    x, y = data(256, 784, 10)
    trainer = nf.Trainer(mlp(2), batch_size=256, memory_pool_size_mb=0.3, progress=False)
    with pytest.raises(OutOfMemoryError, match=r"batch_size=(\d+) without accumulation fits") as info:
        trainer.train_step(x, y)
    fits = int(re.search(r"batch_size=(\d+)", str(info.value)).group(1))
    assert 0 < fits < 256
    nf.Trainer(mlp(2), batch_size=fits, memory_pool_size_mb=0.3, progress=False).train_step(x[:fits], y[:fits])
    with pytest.raises(OutOfMemoryError):
        nf.Trainer(mlp(2), batch_size=fits + 1, memory_pool_size_mb=0.3, progress=False).train_step(x[:fits + 1], y[:fits + 1])


def test_profile_report_and_budget_advice():
    report = nf.memory.profile(mlp(2), (64, 784), optimizer=nf.optim.AdamW(), budget_mb=2.8)
    text = str(report)
    assert "0 Linear(784→128)" in text and "predicted peak of a training step" in text
    rows = {row.name: row.bytes for row in report.rows}
    assert rows["0"]["parameters"] == (784 * 128 + 128) * 4
    assert rows["1"]["activations"] == 64 * 128 * 4
    assert report.largest_batch is not None and report.largest_batch >= 1
    small = nf.memory.profile(mlp(2), (report.largest_batch, 784), optimizer=nf.optim.AdamW())
    bigger = nf.memory.profile(mlp(2), (report.largest_batch + 1, 784), optimizer=nf.optim.AdamW())
    assert small.predicted_peak_bytes <= report.budget_bytes < bigger.predicted_peak_bytes
    with pytest.raises(nf.errors.ConfigError, match="positive batch"):
        nf.memory.profile(mlp(2), (0, 784))


def test_profile_leaves_the_model_untouched():
    model = branchy()
    before = [p.data.copy() for p in model.parameters()]
    dropout = model[2].block[2]
    state = dict(dropout.rng.bit_generator.state)
    nf.memory.profile(model, (8, 20))
    assert dropout.rng.bit_generator.state == state
    assert all(p.grad is None for p in model.parameters())
    for a, p in zip(before, model.parameters()):
        np.testing.assert_array_equal(a, p.data)


def test_heatmap_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "mem.png"
    nf.memory.profile(mlp(2), (64, 784)).to_png(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_arena_online_allocation_and_out_of_memory():
    arena = ArenaAllocator(np, capacity=1024, planned_bytes=512)
    a = arena.allocate((64,), np.float32)  # 256 bytes after the plan
    assert arena.free_bytes == 256
    with pytest.raises(OutOfMemoryError, match=r"needed 512 bytes .* 256 bytes free"):
        arena.allocate((128,), np.float32)
    arena.free(a)
    assert arena.free_bytes == 512
    assert arena.allocate((128,), np.float32).shape == (128,)


def test_caching_allocator_reuses_size_classes():
    cache = CachingAllocator(np)
    a = cache.allocate((100,), np.float32)
    cache.free(a)
    b = cache.allocate((90,), np.float32)
    assert cache.stats().allocations == 1 and b.base is not None
    assert np.shares_memory(a, b)


class Reshaped(nf.Operator):
    """A view of its input (like Flatten) that declares its backward reads neither input nor output."""

    backward_reads_input = False
    backward_reads_output = False

    def forward(self, x):
        self._shape = x.shape
        return x.reshape(x.shape[0], -1)

    def backward(self, grad_out):
        return grad_out.reshape(self._shape)


def dropping_chain(seed=0):
    nf.manual_seed(seed)
    return nf.Sequential(
        ops.Linear(20, 64), ops.ReLU(),  # Linear's output: read by no backward once ReLU ran
        ops.Linear(64, 64), Reshaped(), ops.Linear(64, 32),  # a view of Linear's output, read by the next Linear
        ops.Tanh(), ops.Sigmoid(),  # Tanh's output: Tanh's backward reads it
        nf.Sequential(ops.Linear(32, 32), ops.LeakyReLU(0.1)), ops.Linear(32, 5),  # LeakyReLU reads its input
    )


def _slots_by_owner(plan):
    return {(id(s.owner), s.key): s for s in plan.slots}


def test_an_output_no_backward_reads_dies_when_its_consumer_has_read_it():
    x, y = data(48, 20, 5)
    trainer = train_planned_and_direct(dropping_chain, x, y, lambda: nf.optim.SGD(lr=0.1, momentum=0.9))
    model, slots = trainer.model, _slots_by_owner(trainer.memory.plan)
    first_backward = min(s.start for s in trainer.memory.plan.slots if s.key == "gx")
    dropped = slots[id(model[0]), "y"]
    assert dropped.dropped_at >= 0 and dropped.end < first_backward  # dies in forward, after ReLU
    tanh = slots[id(model[5]), "y"]  # Tanh's backward reads its output
    assert tanh.dropped_at < 0 and tanh.end > first_backward
    # Read by the backward of LeakyReLU, and (through a view) of the Linear after Reshaped: each dies when
    # that reader is done, before the Linear that made it runs its backward.
    for producer in (model[7][0], model[2]):
        tied, made_by = slots[id(producer), "y"], slots[id(producer), "gx"]
        assert first_backward < tied.dropped_at == tied.end < made_by.start


def test_dropping_shrinks_the_arena_of_a_conv_style_chain():
    """Linear → ReLU → Linear → ReLU: each Linear output is dead after its ReLU; without the declarations it is not."""
    x, y = data(64, 784, 10)
    arenas = {}
    for declared in (True, False):
        model = mlp(2, 256)
        if not declared:
            for layer in model:
                if isinstance(layer, ops.Linear):
                    layer.backward_reads_output = True
        trainer = nf.Trainer(model, optimizer=nf.optim.SGD(lr=0.1), batch_size=64, seed=1, progress=False)
        trainer.train_step(x, y)
        arenas[declared] = trainer.memory.plan.arena_bytes
    assert arenas[True] < arenas[False]


class RereadsOutput(nf.Operator):
    """Wrongly declares that backward does not read its output, then asks the pool for it again."""

    backward_reads_output = False

    def forward(self, x):
        y = self.buffer("y", x.shape, x.dtype)
        self.xp.multiply(x, 2.0, out=y)
        return y

    def backward(self, grad_out):
        y = self.buffer("y", grad_out.shape, grad_out.dtype)
        return grad_out * (y > 0)


def test_an_op_that_rereads_a_dropped_output_is_refused_by_name():
    x, y = data(16, 8, 3)
    trainer = nf.Trainer(nf.Sequential(ops.Linear(8, 8), RereadsOutput(), ops.ReLU(), ops.Linear(8, 3)),
                         batch_size=16, progress=False)
    with pytest.raises(RuntimeError, match=r"RereadsOutput.*asked for its buffer 'y' again after its output was dropped"):
        trainer.train_step(x, y)


@pytest.mark.parametrize("pool_kind", ["tracer", "planned"])
def test_relu_gradient_over_its_output_equals_the_gradient_without_a_pool(pool_kind):
    """Under a pool ReLU writes its input gradient over its cached output; the values are those computed without."""
    x, y = data(16, 784, 10)
    runs = []
    for pooled in (False, True):
        model, loss = mlp(2, 32), nf.losses.CrossEntropy()
        if pooled:
            trainer = nf.Trainer(model, loss, batch_size=16, progress=False)
            if pool_kind == "planned":
                trainer.train_step(x, y)  # the traced step; the model's weights move, so reset them
                for p, q in zip(model.parameters(), mlp(2, 32).parameters()):
                    p.data[...] = q.data
                model.attach_pool(trainer.memory.pool)  # lent to the model only during trainer calls: borrow it again
            else:
                model.attach_pool(TracingPool(np))
                loss.attach_pool(model.buffer_pool)
        for p in model.parameters():
            p.grad = np.zeros_like(p.data)
        loss.forward(model.forward(x), y)
        model.backward(loss.backward())
        relu = model[1]
        assert np.shares_memory(relu._cache, relu.backward(np.ones_like(relu._cache))) == pooled
        runs.append([p.grad.copy() for p in model.parameters()])
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("budget", ["3", float("nan"), float("inf"), True, 0, -1.0])
def test_profile_refuses_a_budget_that_is_not_a_positive_finite_number(budget):
    with pytest.raises(nf.errors.ConfigError, match="budget_mb must be a positive finite number of MiB"):
        nf.memory.profile(mlp(1), (8, 784), budget_mb=budget)
