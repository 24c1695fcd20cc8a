"""A Trainer used from several threads: inference calls take turns, a second training thread is refused."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.errors import TrainerInUseError
from neuroflow.operator import Operator

THREADS, CALLS = 8, 25


@pytest.fixture(autouse=True)
def frequent_thread_switches():
    """Switch threads every few microseconds, so that calls from several threads overlap on a busy machine too."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


class _Yield(Operator):
    """Identity that lets the other threads run here, as a slow op (a kernel that releases the GIL) would: the
    calls of several threads then overlap inside the model on any machine, however idle or busy."""

    backward_reads_input = backward_reads_output = False

    def forward(self, x):
        time.sleep(0)
        return x

    def backward(self, grad_out):
        return grad_out


def _mlp(seed=0, overlapping=True):
    nf.manual_seed(seed)
    middle = [_Yield()] if overlapping else []  # not saved: a checkpoint cannot name a test's op
    return nf.Sequential(ops.Linear(6, 64), *middle, ops.Tanh(), ops.Linear(64, 3))


def _cnn(seed=0):
    vision = pytest.importorskip("neuroflow_ops_vision")
    nf.manual_seed(seed)
    return nf.Sequential(vision.Conv2d(1, 4, 3, padding=1), _Yield(), ops.ReLU(), vision.MaxPool2d(2), ops.Flatten(),
                         ops.Linear(4 * 4 * 4, 3))


def _data(shape, n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (rng.standard_normal((n, *shape)) + y.reshape(-1, *[1] * len(shape))).astype(np.float32)
    return x, y


def _in_threads(work, count):
    """Run ``work(i)`` in ``count`` threads released together by a barrier; the first exception is re-raised."""
    barrier = threading.Barrier(count)
    errors = []

    def run(i):
        barrier.wait()
        try:
            work(i)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize("call", ["predict", "evaluate"])
@pytest.mark.parametrize("build, shape", [(_mlp, (6,)), (_cnn, (1, 8, 8))], ids=["mlp", "cnn"])
def test_inference_from_several_threads_gives_each_call_its_own_outputs(build, shape, call):
    trainer = nf.Trainer(build(), batch_size=16, progress=False)
    trainer.fit(_data(shape, 64, seed=0), epochs=1)  # the model now runs on the trainer's planned buffers
    # four batches a call: each call runs the model several times on the same planned buffers
    batches = [[_data(shape, 64, seed=1 + i * CALLS + j) for j in range(CALLS)] for i in range(THREADS)]

    def result(x, y):
        return trainer.predict(x) if call == "predict" else trainer.evaluate((x, y))

    expected = [[result(x, y) for x, y in calls] for calls in batches]
    got = [[None] * CALLS for _ in range(THREADS)]

    def work(i):
        for j, (x, y) in enumerate(batches[i]):
            got[i][j] = result(x, y)

    _in_threads(work, THREADS)
    wrong = [(i, j) for i in range(THREADS) for j in range(CALLS) if not _same(got[i][j], expected[i][j])]
    assert not wrong, f"{len(wrong)} of {THREADS * CALLS} calls returned another call's outputs"


def _same(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-6) for k in a)
    return np.allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("training", ["fit", "train_step"])
def test_predict_while_another_thread_trains_sees_the_weights_of_a_finished_step(training):
    x, y = _data((6,), 64, seed=0)
    probe = _data((6,), 40, seed=9)[0]
    epochs, batch = 6, 8
    batches = [(x[s:s + batch], y[s:s + batch]) for s in range(0, len(x), batch)] * epochs

    # single-threaded: the predictions after each step, and the weights at the end
    alone = nf.Trainer(_mlp(), batch_size=batch, shuffle=False, seed=1, progress=False)
    after_steps = [alone.predict(probe)]
    for xb, yb in batches:
        alone.train_step(xb, yb)
        after_steps.append(alone.predict(probe))

    trainer = nf.Trainer(_mlp(), batch_size=batch, shuffle=False, seed=1, progress=False)
    trainer.predict(probe)
    finished = threading.Event()
    predictions = []

    def work(i):
        if i == 0:
            try:
                if training == "fit":
                    trainer.fit((x, y), epochs=epochs)
                else:
                    for xb, yb in batches:
                        trainer.train_step(xb, yb)
            finally:
                finished.set()
        else:
            while not finished.is_set() or not predictions:
                predictions.append(trainer.predict(probe))

    _in_threads(work, 4)  # one training, three predicting
    # training was not disturbed: the weights are the single-threaded run's, bit for bit
    for a, b in zip(trainer.model.parameters(), alone.model.parameters()):
        np.testing.assert_array_equal(a.data, b.data)
    # every prediction is the model's after some whole step, never a mix of a step and a prediction
    torn = [p for p in predictions if not any(np.array_equal(p, ref) for ref in after_steps)]
    assert not torn, f"{len(torn)} of {len(predictions)} predictions match the model after no step"


class _Gate:
    """An ``augment`` that holds the first thread to call it at its first batch until the test opens the gate."""

    def __init__(self):
        self.inside, self.open = threading.Event(), threading.Event()
        self.held: threading.Thread | None = None

    def __call__(self, x):
        if self.held is None:
            self.held = threading.current_thread()
        if self.held is not threading.current_thread():
            return x
        self.inside.set()
        if not self.open.wait(timeout=30):
            raise RuntimeError("the test never opened the gate")
        return x


@pytest.mark.parametrize("second", ["fit", "train_step", "resume", "save_checkpoint"])
def test_training_from_a_second_thread_is_refused_while_one_trains(second, tmp_path):
    x, y = _data((6,), 32, seed=0)
    reference = nf.Trainer(_mlp(overlapping=False), batch_size=8, shuffle=False, seed=1, progress=False)
    reference.fit((x, y), epochs=2)

    gate = _Gate()
    trainer = nf.Trainer(_mlp(overlapping=False), batch_size=8, shuffle=False, seed=1, progress=False, augment=gate,
                         checkpoint_dir=tmp_path)
    trainer.save_checkpoint()  # something to resume from: without the refusal, resume would rewind the run
    errors = []

    def train():
        try:
            trainer.fit((x, y), epochs=2)
        except BaseException as error:  # noqa: BLE001 - checked below
            errors.append(error)

    thread = threading.Thread(target=train, name="the-trainer")
    thread.start()
    try:
        assert gate.inside.wait(timeout=30), "fit never reached its first batch"
        with pytest.raises(TrainerInUseError, match=rf"{second} .*thread 'the-trainer' is training this trainer"):
            if second == "fit":
                trainer.fit((x, y), epochs=1)
            elif second == "train_step":
                trainer.train_step(x[:8], y[:8])
            elif second == "resume":
                trainer.resume(tmp_path)
            else:
                trainer.save_checkpoint()
    finally:
        gate.open.set()
        thread.join()
    assert not errors
    assert trainer.step == reference.step
    for a, b in zip(trainer.model.parameters(), reference.model.parameters()):
        np.testing.assert_array_equal(a.data, b.data)
    # once that thread is done, any thread may train
    trainer.train_step(x[:8], y[:8])
    assert trainer.step == reference.step + 1


def test_a_trainer_used_in_turns_by_threads_trains_as_one():
    x, y = _data((6,), 32, seed=0)
    alone = nf.Trainer(_mlp(overlapping=False), batch_size=8, shuffle=False, seed=1, progress=False)
    alone.fit((x, y), epochs=1)
    alone.train_step(x[:8], y[:8])
    trainer = nf.Trainer(_mlp(overlapping=False), batch_size=8, shuffle=False, seed=1, progress=False)
    first = threading.Thread(target=trainer.fit, args=((x, y),), kwargs={"epochs": 1})
    first.start()
    first.join()
    trainer.train_step(x[:8], y[:8])  # another thread, after the first returned: allowed
    for a, b in zip(trainer.model.parameters(), alone.model.parameters()):
        np.testing.assert_array_equal(a.data, b.data)
