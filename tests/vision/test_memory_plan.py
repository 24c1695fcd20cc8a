"""Vision models under the memory planner: workspaces are planned, the prediction holds, steady steps allocate nothing."""

from __future__ import annotations

import numpy as np
import pytest

import neuroflow as nf
from neuroflow.trainer.budget import static_bytes
from neuroflow_ops_vision import resnet18

from .step_memory import measure_steps


def small_resnet() -> nf.Operator:
    nf.manual_seed(0)
    return resnet18(num_classes=10)


def spec_cnn() -> nf.Operator:
    """The spec's CNN as a user writes it (no layout argument): the layout pass runs it in NHWC, converting before
    Flatten."""
    from neuroflow import ops

    nf.manual_seed(0)
    return nf.Sequential(ops.Conv2d(3, 32, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
                         ops.Conv2d(32, 64, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
                         ops.Flatten(), ops.Linear(64 * 8 * 8, 10))


CASES = [(small_resnet, (3, 16, 16)), (spec_cnn, (3, 32, 32))]


def batch(sample: tuple[int, ...], n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, *sample)).astype(np.float32), rng.integers(0, 10, n)


@pytest.mark.parametrize(("make", "sample"), CASES)
def test_predicted_peak_matches_the_measured_steady_state_peak(make, sample) -> None:
    x, y = batch(sample)
    predicted = nf.memory.profile(make(), x.shape, optimizer=nf.optim.SGD(lr=0.01, momentum=0.9)).predicted_peak_bytes
    measured = measure_steps(lambda: nf.Trainer(make(), optimizer=nf.optim.SGD(lr=0.01, momentum=0.9),
                                                batch_size=len(x), progress=False), x, y)
    # The model is built under tracemalloc: its parameters count once (packing them freed the originals).
    assert abs(predicted - measured.peak) / measured.peak <= 0.05, (predicted, measured.peak)
    # The traced first step reuses memory as the plan will: well under the unshared sum of all buffers.
    assert measured.first_peak < 1.5 * predicted, (measured.first_peak, predicted)
    assert measured.grown == []


@pytest.mark.parametrize(("make", "sample"), CASES)
def test_planned_training_matches_unplanned_training_bit_for_bit(make, sample) -> None:
    """The traced first step recycles dead buffers: any buffer reused too early would change the weights."""
    x, y = batch(sample, 16)
    runs = []
    for allocator in ("arena", "direct"):
        trainer = nf.Trainer(make(), optimizer=nf.optim.SGD(lr=0.05, momentum=0.9), batch_size=8, seed=1,
                             allocator=allocator, progress=False)
        trainer.fit((x, y), epochs=2)
        runs.append([p.data.copy() for p in trainer.model.parameters()])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_workspaces_are_planned_in_the_arena() -> None:
    from neuroflow.memory.profile import trace_step

    slots = trace_step(small_resnet(), nf.losses.CrossEntropy(), (4, 3, 16, 16))
    end_of_step = max(s.end for s in slots)
    weights = [s for s in slots if s.key.endswith("conv.wmat")]
    assert {s.key for s in weights} == {"forward.conv.wmat", "backward.conv.wmat"}
    # transient: each lives for one call, not to the end of the step, so all convolutions share the memory
    assert all(s.end < end_of_step and s.end - s.start < 30 for s in weights)


def test_gradients_written_whole_are_not_zeroed_and_training_is_unchanged(monkeypatch) -> None:
    """Convolution and linear weights get their whole gradient written each step, so the Trainer stops
    zeroing them first; training must match, bit for bit, a run that zeroes every gradient."""
    from neuroflow.buffers.flat import FlatParameters

    x, y = batch((3, 16, 16), 16)
    runs, skipped = [], []
    zero_grad = FlatParameters.zero_grad
    for zero_all in (False, True):
        if zero_all:
            monkeypatch.setattr(FlatParameters, "zero_grad", lambda self, skip=(): zero_grad(self))
        trainer = nf.Trainer(small_resnet(), optimizer=nf.optim.SGD(lr=0.05, momentum=0.9), batch_size=8, seed=1,
                             progress=False)
        trainer.fit((x, y), epochs=2)
        runs.append([p.data.copy() for p in trainer.model.parameters()])
        skipped.append({name for name, p in trainer.model.named_parameters() if id(p) in trainer.memory.pool.whole_gradients})
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    kernels = {name for name, p in small_resnet().named_parameters() if p.data.ndim == 4}
    assert skipped[0] == kernels | {"fc.weight", "fc.bias"}  # BatchNorm's are added into: still zeroed


def test_update_in_backward_trains_a_resnet_identically_without_its_kernels_gradients() -> None:
    """The kernels' and the fc layer's updates are applied inside backward: the weights are those of updating
    after it, those parameters keep no gradient (BatchNorm's do), and the step's fixed memory loses them."""
    x, y = batch((3, 16, 16), 16)
    runs, trainers = [], []
    for update_in_backward in (False, True):
        trainer = nf.Trainer(small_resnet(), optimizer=nf.optim.SGD(lr=0.05, momentum=0.9), batch_size=8, seed=1,
                             progress=False, update_in_backward=update_in_backward)
        trainer.fit((x, y), epochs=2)
        runs.append([p.data.copy() for p in trainer.model.parameters()])
        trainers.append(trainer)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    streaming = trainers[1]
    kept = {name for name, p in streaming.model.named_parameters() if p.grad is not None}
    assert kept == {name for name, p in streaming.model.named_parameters() if p.data.ndim == 1} - {"fc.bias"}
    streamed_bytes = sum(p.data.nbytes for p in streaming.model.parameters()) - sum(
        p.data.nbytes for name, p in streaming.model.named_parameters() if name in kept)
    assert static_bytes(trainers[0].memory) - static_bytes(streaming.memory) == streamed_bytes


def test_update_in_backward_adds_almost_nothing_to_resnet18s_arena() -> None:
    """A kernel's gradient workspace is taken once its columns are retired where its convolution runs in one
    chunk (the last stage's), so it shares their memory; where the step peaks now (layer2's first block, at
    batch 32) one 0.56 MiB kernel gradient sits beside the columns: 104.6 MiB against 103.4, where the flat
    gradient buffer it replaces is 42.6 MiB."""
    x, y = batch((3, 32, 32), 32)
    arenas = []
    for update_in_backward in (False, True):
        trainer = nf.Trainer(small_resnet(), optimizer=nf.optim.SGD(lr=0.01, momentum=0.9), batch_size=32,
                             progress=False, update_in_backward=update_in_backward)
        for _ in range(2):  # streaming traces its second step
            trainer.train_step(x, y)
        arenas.append(trainer.memory.plan.arena_bytes)
    assert arenas[1] <= 1.02 * arenas[0], arenas


def test_a_batch_in_uneven_chunks_keeps_its_plan() -> None:
    """Chunks of 2 + 2 + 1 samples: each call asks for its columns once, the last chunk taking a leading part,
    so the tracer sees one shape per buffer and the step is planned (one shape twice would abandon the plan)."""
    from neuroflow import ops

    nf.manual_seed(0)
    second = ops.Conv2d(8, 8, 3, padding=1, layout="NHWC")
    per_sample = second.workspace_bytes_per_sample((8, 8))
    gradient_per_sample = (10 * 10 * 8 + 8 * 8 * 9 * 8) * 4  # the padded output gradient and its columns
    second.max_workspace_bytes = 2 * max(per_sample, gradient_per_sample)
    model = nf.Sequential(ops.Conv2d(3, 8, 3, padding=1, output_layout="NHWC"), ops.ReLU(), second, ops.ReLU(),
                          ops.GlobalAvgPool2d(layout="NHWC"), ops.Linear(8, 3))
    assert second.chunk_size((5, 8, 8, 8)) == second.grad_chunk_size((5, 8, 8, 8)) == 2
    trainer = nf.Trainer(model, optimizer=nf.optim.SGD(lr=0.1), batch_size=5, progress=False)
    rng = np.random.default_rng(0)
    trainer.train_step(rng.standard_normal((5, 3, 8, 8)).astype(np.float32), rng.integers(0, 3, 5))
    assert trainer.memory.plan is not None and trainer.memory.pool.grads_zeroed


def test_a_downsampling_blocks_shortcut_output_dies_with_its_forward() -> None:
    """The shortcut's BatchNorm output is added into the block's output and never read again: kept to the step's
    end it would sit at the peak (7 MiB in ResNet-18 at batch 32)."""
    from neuroflow.memory.profile import trace_step

    model = small_resnet()
    slots = trace_step(model, nf.losses.CrossEntropy(), (4, 3, 16, 16))
    backward_starts = min(s.start for s in slots if s.phase == "backward")
    shortcuts = [model.layer2[0].downsample[1], model.layer3[0].downsample[1], model.layer4[0].downsample[1]]
    outputs = [s for s in slots if s.key == "y" and any(s.owner is bn for bn in shortcuts)]
    assert len(outputs) == 3
    assert all(s.end < backward_starts for s in outputs), [(s.start, s.end, backward_starts) for s in outputs]


def test_block_outputs_die_in_forward_and_are_recomputed_in_backward() -> None:
    """Every block's output but the last (and the stem's) dies once the next block has read it; backward
    recomputes it. Trained so, a ResNet reaches the same weights bit for bit, in a smaller arena."""
    from neuroflow.memory.profile import trace_step

    model = small_resnet()
    slots = trace_step(model, nf.losses.CrossEntropy(), (4, 3, 16, 16))
    backward_starts = min(s.start for s in slots if s.phase == "backward")
    blocks = [b for stage in (model.layer1, model.layer2, model.layer3, model.layer4) for b in stage]
    outputs = {id(block.bn2): s for block in blocks for s in slots if s.owner is block.bn2 and s.key == "y"}
    outputs[id(model.bn1)] = next(s for s in slots if s.owner is model.bn1 and s.key == "y")
    assert len(outputs) == len(blocks) + 1
    # the last block's output is read by its own backward first (its ReLU's mask): kept
    assert [s.end < backward_starts for s in outputs.values()] == [True] * (len(blocks) - 1) + [False, True]
    recomputed = [s for s in slots if s.key.startswith("recomputed.")]
    assert len(recomputed) == len(blocks)  # all but the last block's, and the stem's

    x, y = batch((3, 16, 16), 16)
    runs, arenas = [], []
    for recompute in (False, True):
        nf.manual_seed(0)
        trainer = nf.Trainer(resnet18(num_classes=10, recompute_block_outputs=recompute),
                             optimizer=nf.optim.SGD(lr=0.05, momentum=0.9), batch_size=8, seed=1, progress=False)
        trainer.fit((x, y), epochs=2)
        runs.append([p.data.copy() for p in trainer.model.parameters()])
        arenas.append(trainer.memory.plan.arena_bytes)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    assert arenas[1] < 0.9 * arenas[0], arenas  # 15.0 MiB against 17.2 (ResNet-18 at batch 32: 110.4 against 137.9)


def test_the_traced_steps_memory_is_released_by_the_first_step(monkeypatch) -> None:
    """The traced first step runs in one reservation; any array of it left alive (in a reference cycle, which
    only the cyclic collector would free) keeps every page it touched resident beside the arena."""
    import gc
    import weakref

    from neuroflow.buffers import trace

    reservations = []

    def watched(xp, least):
        memory = reserved(xp, least)
        if memory is not None:
            reservations.append(weakref.ref(memory))
        return memory

    reserved = trace._reserved_bytes
    monkeypatch.setattr(trace, "_reserved_bytes", watched)
    x, y = batch((3, 16, 16))
    trainer = nf.Trainer(small_resnet(), optimizer=nf.optim.SGD(lr=0.01, momentum=0.9), batch_size=len(x),
                         progress=False)
    gc.disable()
    try:
        trainer.train_step(x, y)
        assert reservations and all(ref() is None for ref in reservations)
    finally:
        gc.enable()


def test_a_separable_convolutions_depthwise_map_dies_with_the_pointwise_backward() -> None:
    """Inside SeparableConv2d, as in a chain: the depthwise output (the pointwise's input) is dead once the
    pointwise's backward is done, before the depthwise's backward asks for its input gradient."""
    from neuroflow.memory.profile import trace_step
    from neuroflow_ops_vision import SeparableConv2d

    nf.manual_seed(0)
    separable = SeparableConv2d(8, 16, 3, padding=1, layout="NHWC")
    model = nf.Sequential(nf.ops.Conv2d(3, 8, 3, padding=1, output_layout="NHWC"), separable,
                          nf.ops.GlobalAvgPool2d(layout="NHWC"), nf.ops.Linear(16, 10))
    slots = trace_step(model, nf.losses.CrossEntropy(), (4, 3, 12, 12))
    mid = next(s for s in slots if s.owner is separable.depthwise and s.key == "y")
    gx = next(s for s in slots if s.owner is separable.depthwise and s.key == "gx")
    assert mid.end < gx.start, (mid.end, gx.start)


def test_a_concat_branch_output_its_backward_does_not_read_dies_once_copied() -> None:
    """ChannelConcat copies its branches' outputs: an Upsample's (whose backward reads only shapes) dies at the
    concat's forward; a branch that reads its output in backward (a fused ReLU's mask) keeps it."""
    from neuroflow.memory.profile import trace_step
    from neuroflow_ops_vision import BatchNorm2d, ChannelConcat, Upsample

    nf.manual_seed(0)
    up = Upsample(scale_factor=2, layout="NHWC")
    norm = BatchNorm2d(8, activation="relu", layout="NHWC")
    concat = ChannelConcat(nf.Sequential(nf.ops.MaxPool2d(2, layout="NHWC"), up), nf.Sequential(norm), layout="NHWC")
    model = nf.Sequential(nf.ops.Conv2d(3, 8, 3, padding=1, output_layout="NHWC"), concat,
                          nf.ops.GlobalAvgPool2d(layout="NHWC"), nf.ops.Linear(16, 10))
    slots = trace_step(model, nf.losses.CrossEntropy(), (4, 3, 12, 12))
    backward_starts = min(s.start for s in slots if s.phase == "backward")
    assert next(s for s in slots if s.owner is up and s.key == "y").end < backward_starts
    assert next(s for s in slots if s.owner is norm and s.key == "y").end > backward_starts
