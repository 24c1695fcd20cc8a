"""Step replay (neuroflow.replay): a recorded steady step trains bit for bit as the ops would, and any change it
depends on runs the ops again. Every test compares a Trainer with a ``replay_steps=False`` twin fed the same calls."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import debug, ops
from neuroflow.errors import NonFiniteDataError, ShapeError
from neuroflow.operator import Operator
from neuroflow.replay import StepReplay

FEATURES, CLASSES, BATCH = 20, 5, 32


# ---------------------------------------------------------------------------------------------------- helpers
def _mlp(seed=0):
    nf.manual_seed(seed)
    return nf.Sequential(ops.Linear(FEATURES, 32), ops.ReLU(), ops.Linear(32, 16), ops.ReLU(),
                         ops.Linear(16, CLASSES))


def _batch(seed, rows=BATCH, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, FEATURES)).astype(dtype), rng.integers(0, CLASSES, rows)


def _sgd():
    return nf.optim.SGD(lr=0.1, momentum=0.9)


def _twins(build=_mlp, optimizer=_sgd, **options):
    """(replaying, plain): the same model, optimizer and options, one with replay off."""
    return tuple(nf.Trainer(build(), optimizer=optimizer(), batch_size=BATCH, progress=False, seed=0,
                            replay_steps=replay, **options) for replay in (True, False))


def _outcome(trainer, action):
    """What ``action(trainer)`` returned, or the type and message of what it raised."""
    try:
        result = action(trainer)
    except Exception as error:  # noqa: BLE001 - compared with the twin's
        return type(error), str(error)
    return result.tolist() if isinstance(result, np.ndarray) else result


def _params(trainer):
    return [p.data.copy() for p in trainer.model.parameters()]


def _assert_same_weights(a, b):
    for i, (p, q) in enumerate(zip(_params(a), _params(b), strict=True)):
        assert np.array_equal(p, q), f"parameter {i} differs by up to {np.abs(p - q).max()}"


def _assert_same_training(actions, build=_mlp, optimizer=_sgd, **options):
    """Run ``actions`` on each twin; the same results (losses, errors) and weights. Returns the replaying one."""
    replaying, plain = _twins(build, optimizer, **options)
    got = [_outcome(replaying, action) for action in actions]
    expected = [_outcome(plain, action) for action in actions]
    assert got == expected
    _assert_same_weights(replaying, plain)
    return replaying


def _steps(seeds, rows=BATCH):
    return [lambda t, s=s: t.train_step(*_batch(s, rows)) for s in seeds]


def _history(history):
    return [{k: v for k, v in epoch.items() if k != "time_s"} for epoch in history]


@pytest.fixture
def replays(monkeypatch):
    """The number of steps that ran as a replay (StepReplay.forward gave a loss)."""
    count = [0]
    forward = StepReplay.forward

    def counted(self, x, y):
        value = forward(self, x, y)
        count[0] += value is not None
        return value

    monkeypatch.setattr(StepReplay, "forward", counted)
    return count


@pytest.fixture
def linear_calls(monkeypatch):
    """The batch sizes ops.Linear.forward ran on, in order."""
    calls = []
    forward = ops.Linear.forward

    def spied(self, x):
        calls.append(len(x))
        return forward(self, x)

    monkeypatch.setattr(ops.Linear, "forward", spied)
    return calls


@pytest.fixture(autouse=True)
def debug_restored():
    was = debug.enabled()
    yield
    debug.set_enabled(was)


# ---------------------------------------------------------------------------------------------------- 1. identity
@pytest.mark.parametrize("optimizer", [
    lambda: nf.optim.SGD(lr=0.1),
    lambda: nf.optim.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    lambda: nf.optim.Adam(lr=1e-2),
    lambda: nf.optim.AdamW(lr=1e-2, weight_decay=0.1),
], ids=["sgd", "sgd-nesterov-decay", "adam", "adamw"])
def test_replayed_steps_are_bit_identical_to_replay_off(optimizer, replays, linear_calls):
    replaying, plain = _twins(optimizer=optimizer)
    batches = [_batch(i % 7) for i in range(40)]
    got = [replaying.train_step(x, y) for x, y in batches[:3]]  # trace, plan, record
    del linear_calls[:]
    got += [replaying.train_step(x, y) for x, y in batches[3:]]
    assert replaying._steps.replay is not None
    assert replays[0] == 37
    assert linear_calls == []  # the replayed steps ran no op
    expected = [plain.train_step(x, y) for x, y in batches]
    assert all(isinstance(v, float) for v in got)
    assert got == expected
    _assert_same_weights(replaying, plain)


# ---------------------------------------------------------------------------------------------------- 2. fit
def test_fit_with_a_short_last_batch_replays_both_batch_shapes(replays, linear_calls):
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((100, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, 100))
    replaying, plain = _twins()
    history = replaying.fit(data, epochs=3)
    short = linear_calls.count(100 % BATCH)
    assert len(replaying._steps.replays) == 2  # the full batch's and the short one's
    assert replays[0] == 8  # epochs 2 and 3: every batch (the first epoch traced, planned and recorded)
    assert short == 3  # only the first epoch's short batch ran the three linear layers (and was recorded)
    assert _history(history) == _history(plain.fit(data, epochs=3))
    _assert_same_weights(replaying, plain)


# ---------------------------------------------------------------------------------------------------- 3. changes
def _freeze(t):
    layer = t.model.layers[2]
    layer.weight.requires_grad = layer.bias.requires_grad = False


def _unfreeze(t):
    layer = t.model.layers[2]
    layer.weight.requires_grad = layer.bias.requires_grad = True


def _new_weight(t):
    t.model.layers[2].weight.data = np.random.default_rng(5).standard_normal((16, 32)).astype(np.float32)


def _new_weight_as_a_view(t):
    """A new array that is a view (``base`` not None), as ``np.load(path).reshape(...)`` gives."""
    flat = np.random.default_rng(5).standard_normal(16 * 32).astype(np.float32)
    t.model.layers[2].weight.data = flat.reshape(16, 32)


def _weight_in_place(t):
    t.model.layers[2].weight.data[...] = np.random.default_rng(5).standard_normal((16, 32)).astype(np.float32)


def _bias_in_place(t):
    t.model.layers[4].bias.data += 0.5


def _smooth_labels(t):
    t.loss.label_smoothing = 0.1


def _predict_and_evaluate(t):
    return [t.predict(_batch(90, rows=50)[0]).tolist(), t.evaluate(_batch(91, rows=BATCH)),
            t.predict(_batch(92, rows=7)[0]).tolist()]


def _eval_mode(t):
    t.model.eval()


def _with_labels(change):
    def step(t):
        x, y = _batch(50)
        change(y)
        return t.train_step(x, y)
    return step


def _with_inputs(change):
    def step(t):
        x, y = _batch(51)
        change(x)
        return t.train_step(x, y)
    return step


def _set(index, value):
    def change(a):
        a[index] = value
    return change


CHANGES = {
    "freeze-a-layer": [_freeze],
    "freeze-then-unfreeze": [_freeze, *_steps(range(3)), _unfreeze],
    "replace-a-weight": [_new_weight],
    "replace-a-weight-with-a-view": [_new_weight_as_a_view],
    "weight-in-place": [_weight_in_place],
    "bias-in-place": [_bias_in_place],
    "label-smoothing": [_smooth_labels],
    "another-model": [lambda t: setattr(t, "model", _mlp(seed=1))],
    "float64-input": [lambda t: t.train_step(*_batch(60, dtype=np.float64))],
    "larger-batch": _steps([61, 62], rows=2 * BATCH),
    "smaller-batch": _steps([63], rows=7),
    "predict-and-evaluate": [_predict_and_evaluate],
    "eval-mode": [_eval_mode, *_steps([70]), lambda t: t.model.training],
    "label-too-large": [_with_labels(_set(3, CLASSES))],
    "label-negative": [_with_labels(_set(3, -1))],
    "nan-input": [_with_inputs(_set((2, 3), np.nan))],
    "inf-input": [_with_inputs(_set((5, 0), np.inf))],
    "overflowing-input": [_with_inputs(_set((5, 0), 3e38))],
}


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_change_after_replay_started_trains_as_replay_off(change, replays):
    warm_up = _steps([i % 4 for i in range(6)])
    after = _steps([10 + i % 4 for i in range(6)])
    replaying, plain = _twins()
    for step in warm_up:
        step(replaying)
    assert replays[0] == 3 and replaying._steps.replay is not None  # the change meets an active replay
    got = [_outcome(replaying, action) for action in change + after]
    for step in warm_up:
        step(plain)
    expected = [_outcome(plain, action) for action in change + after]
    assert got == expected
    _assert_same_weights(replaying, plain)


@pytest.mark.parametrize("label", [CLASSES, -3], ids=["too-large", "negative"])
def test_a_bad_label_during_replay_raises_the_ops_error_and_the_replay_goes_on(label, replays):
    replaying, _ = _twins()
    for step in _steps(range(4)):
        step(replaying)
    count = replays[0]
    with pytest.raises(ShapeError, match="labels outside"):
        _with_labels(_set(0, label))(replaying)
    replaying.train_step(*_batch(0))
    assert replays[0] == count + 1


def test_nan_input_during_replay_names_the_data():
    replaying, _ = _twins()
    for step in _steps(range(4)):
        step(replaying)
    with pytest.raises(NonFiniteDataError) as raised:
        _with_inputs(_set((2, 3), np.nan))(replaying)
    assert (raised.value.which, raised.value.samples, raised.value.step) == ("inputs", [2], 5)


def test_a_batch_of_another_size_keeps_the_replay_and_a_new_plan_drops_it(replays):
    replaying, _ = _twins()
    for step in _steps(range(4)):
        step(replaying)
    kept = replaying._steps.replay
    replaying.train_step(*_batch(5, rows=7))  # smaller: the same plan, recorded as a second replay
    assert replaying._steps.replay is not kept and len(replaying._steps.replays) == 2
    assert kept in replaying._steps.replays.values()
    replaying.train_step(*_batch(6, rows=2 * BATCH))  # larger: planned anew
    replaying.train_step(*_batch(7, rows=2 * BATCH))
    assert kept not in replaying._steps.replays.values()


def test_edited_layer_list_trains_as_replay_off():
    """``Sequential._run`` follows ``layers`` as they change; a replay recorded before the change must not."""
    def drop_second_relu(t):
        del t.model.layers[3]

    _assert_same_training(_steps(range(6)) + [drop_second_relu] + _steps(range(6)))


# ---------------------------------------------------------------------------------------------------- 4. refusal
class _ScaledLinear(ops.Linear):
    """A user's Linear whose forward scales its output: its parent's replay calls do not stand for it."""

    forwards = 0

    def forward(self, x):
        type(self).forwards += 1
        y = super().forward(x)
        y *= 0.5
        return y


class _PenalisedLinear(ops.Linear):
    """A user's Linear that adds an L1 penalty's gradient in the helper its backward calls."""

    def _weight_and_bias_grads(self, xp, g2, x2):
        super()._weight_and_bias_grads(xp, g2, x2)
        self.weight.grad += 0.01 * np.sign(self.weight.data)


class _Scale(Operator):
    """A user's op with no replay: y = 2x."""

    backward_reads_input = backward_reads_output = False

    def forward(self, x):
        y = self.buffer("y", x.shape, x.dtype)
        np.multiply(x, 2.0, out=y)
        return y

    def backward(self, grad_out):
        g = self.buffer("g", grad_out.shape, grad_out.dtype)
        np.multiply(grad_out, 2.0, out=g)
        return g


def _with_middle(layer):
    def build():
        nf.manual_seed(0)
        return nf.Sequential(ops.Linear(FEATURES, 32), ops.ReLU(), layer(), ops.ReLU(), ops.Linear(16, CLASSES))
    return build


def test_a_subclass_that_overrides_forward_is_never_replayed(monkeypatch):
    monkeypatch.setattr(_ScaledLinear, "forwards", 0)
    steps = 12
    replaying = _assert_same_training(_steps(range(steps)), build=_with_middle(lambda: _ScaledLinear(32, 16)))
    assert replaying._steps.replay is None
    assert replaying._steps._refused is not None
    assert _ScaledLinear.forwards == 2 * steps  # every step of both twins ran the override


@pytest.mark.parametrize("layer", [
    lambda: nf.Sequential(ops.Linear(32, 16), _Scale()),
    lambda: nf.Sequential(ops.Linear(32, 16), ops.Dropout(0.2, seed=3)),
    lambda: nf.Sequential(ops.Linear(32, 16), ops.GELU()),
], ids=["user-op", "dropout", "gelu"])
def test_a_model_with_an_op_that_cannot_be_replayed_trains_as_replay_off(layer, replays):
    replaying = _assert_same_training(_steps(range(12)), build=_with_middle(layer))
    assert replaying._steps.replay is None and replays[0] == 0


def test_a_subclass_that_overrides_a_helper_of_backward_trains_as_replay_off():
    _assert_same_training(_steps(range(12)), build=_with_middle(lambda: _PenalisedLinear(32, 16)))


def test_a_forward_replaced_on_the_instance_trains_as_replay_off():
    def double_the_logits(t):
        layer = t.model.layers[4]
        forward = type(layer).forward

        def doubled(x):
            y = forward(layer, x)
            y *= 2.0
            return y

        layer.forward = doubled

    _assert_same_training(_steps(range(6)) + [double_the_logits] + _steps(range(6)))


# ---------------------------------------------------------------------------------------------------- 5. features
FEATURE_OPTIONS = {
    "accumulation": dict(gradient_accumulation_steps=2),
    "clip": dict(clip_grad_norm=0.05),
    "debug": dict(debug=True),
    "update-in-backward": dict(update_in_backward=True),
    "memory-budget": dict(memory_budget_mb=64),
}


@pytest.mark.parametrize("options", FEATURE_OPTIONS.values(), ids=FEATURE_OPTIONS.keys())
def test_train_step_with_a_feature_trains_as_replay_off(options):
    _assert_same_training(_steps([i % 5 for i in range(16)]), **options)


def test_clip_and_budget_are_replayed(replays):
    _assert_same_training(_steps(range(8)), clip_grad_norm=0.05, memory_budget_mb=64)
    assert replays[0] == 5


def test_fit_with_a_scheduler_trains_as_replay_off(replays):
    rng = np.random.default_rng(1)
    data = (rng.standard_normal((128, FEATURES)).astype(np.float32), rng.integers(0, CLASSES, 128))
    replaying, plain = (nf.Trainer(_mlp(), optimizer=nf.optim.SGD(lr=0.2, momentum=0.9), progress=False, seed=0,
                                   batch_size=BATCH, scheduler=nf.schedulers.Cosine(warmup_epochs=1),
                                   replay_steps=replay) for replay in (True, False))
    history = _history(replaying.fit(data, epochs=5))
    assert replays[0] == 5 * 4 - 3  # all but the traced, the planned and the recorded step
    assert history == _history(plain.fit(data, epochs=5))
    _assert_same_weights(replaying, plain)


# ---------------------------------------------------------------------------------------------------- 6. threads
@pytest.fixture
def frequent_thread_switches():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


def test_predictions_from_another_thread_do_not_change_replayed_training(replays, frequent_thread_switches):
    replaying, plain = _twins()
    batches = [_batch(i % 4) for i in range(120)]
    probes = [_batch(80, rows=rows)[0] for rows in (13, BATCH, 70)]
    stop, predicted = threading.Event(), [0]

    def predict():
        while not stop.is_set():
            replaying.predict(probes[predicted[0] % len(probes)])
            predicted[0] += 1

    thread = threading.Thread(target=predict)
    thread.start()
    try:
        got = [replaying.train_step(x, y) for x, y in batches]
    finally:
        stop.set()
        thread.join()
    assert predicted[0] > 0 and replays[0] > 0
    assert got == [plain.train_step(x, y) for x, y in batches]
    _assert_same_weights(replaying, plain)


# ---------------------------------------------------------------------------------------------------- 7. arrays
def _labels_as(dtype):
    return [lambda t, s=s: t.train_step(_batch(s)[0], _batch(s)[1].astype(dtype)) for s in range(10)]


def _strided_inputs():
    def step(t, s):
        wide = np.random.default_rng(s).standard_normal((BATCH, 2 * FEATURES)).astype(np.float32)
        return t.train_step(wide[:, ::2], _batch(s)[1])
    return [lambda t, s=s: step(t, s) for s in range(10)]


ARRAYS = {
    "int32-labels": _labels_as(np.int32),
    "uint8-labels": _labels_as(np.uint8),
    "int8-labels": _labels_as(np.int8),
    "strided-inputs": _strided_inputs(),
    "fortran-inputs": [lambda t, s=s: t.train_step(np.asfortranarray(_batch(s)[0]), _batch(s)[1]) for s in range(10)],
    "strided-labels": [lambda t, s=s: t.train_step(_batch(s)[0], np.repeat(_batch(s)[1], 2)[::2]) for s in range(10)],
}


@pytest.mark.parametrize("steps", ARRAYS.values(), ids=ARRAYS.keys())
def test_arrays_of_other_types_and_layouts_replay_as_replay_off(steps, replays):
    _assert_same_training(steps)
    assert replays[0] == len(steps) - 3


# ---------------------------------------------------------------------------------------------------- 8. more ops
def _image_mlp(seed=0):
    nf.manual_seed(seed)
    return nf.Sequential(ops.Flatten(), ops.Linear(FEATURES, 16), ops.Tanh(), ops.Linear(16, 8), ops.Sigmoid(),
                         ops.Linear(8, CLASSES))


def _images(seed, rows=BATCH):
    x, y = _batch(seed, rows)
    return x.reshape(rows, 1, 4, 5), y


@pytest.mark.parametrize("contiguous", [True, False])
def test_flatten_of_the_input_tanh_and_sigmoid_replay_as_the_ops_train(replays, contiguous):
    def step(t, s):
        x, y = _images(s)
        if not contiguous:  # a strided copy: Flatten's reshape copies it, in the replay as in the ops
            x = np.repeat(x, 2, axis=3)[..., ::2]
        return t.train_step(x, y)

    replaying = _assert_same_training([lambda t, s=s: step(t, s) for s in range(12)], build=_image_mlp)
    assert replaying._steps.replay is not None
    assert replays[0] == 9


def test_mse_replays_as_it_trains(replays):
    def build():
        nf.manual_seed(0)
        return nf.Sequential(ops.Linear(FEATURES, 16), ops.Sigmoid(), ops.Linear(16, 3))

    def step(t, s):
        rng = np.random.default_rng(s)
        return t.train_step(rng.standard_normal((BATCH, FEATURES)).astype(np.float32),
                            rng.standard_normal((BATCH, 3)).astype(np.float32))

    replaying, plain = (nf.Trainer(build(), nf.losses.MSE(), _sgd(), progress=False, replay_steps=r)
                        for r in (True, False))
    assert [step(replaying, s) for s in range(10)] == [step(plain, s) for s in range(10)]
    _assert_same_weights(replaying, plain)
    assert replays[0] == 7


class _LeakyTanh(ops.Tanh):
    """A user's Tanh whose backward lets some gradient through everywhere: not what Tanh's replay repeats."""

    def _backward(self, g, gx):
        super()._backward(g, gx)
        gx += 0.01 * g


class _VouchedTanh(ops.Tanh):
    """A user's Tanh that says its own ``_forward``/``_backward`` are what a replay may call again."""

    replays_as_written = True

    def _forward(self, x, y):
        super()._forward(x, y)
        y *= 0.5
        return y

    def _backward(self, g, gx):
        np.multiply(self._cache, self._cache, out=gx)
        np.subtract(0.25, gx, out=gx)
        gx *= 2.0 * g


@pytest.mark.parametrize("activation, replayed", [(ops.GELU, False), (_LeakyTanh, False), (_VouchedTanh, True)])
def test_activations_replay_only_where_their_class_vouches_for_it(activation, replayed):
    def build():
        nf.manual_seed(0)
        return nf.Sequential(ops.Linear(FEATURES, 16), activation(), ops.Linear(16, CLASSES))

    replaying = _assert_same_training(_steps(range(8)), build=build)
    assert (replaying._steps.replay is not None) is replayed
