"""Schedulers: values at known steps, argument validation, checkpoints."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from neuroflow.schedulers import Constant, Cosine, Scheduler, Step

BASE = 1e-3


def bound(scheduler: Scheduler, steps_per_epoch: int = 10, total_steps: int = 110, base_lr: float = BASE) -> Scheduler:
    scheduler.bind(base_lr, steps_per_epoch, total_steps)
    return scheduler


def test_constant_keeps_base_lr() -> None:
    scheduler = bound(Constant())
    assert [scheduler.lr(s) for s in (0, 1, 55, 109, 500)] == [BASE] * 5


# ----------------------------------------------------------------------------------------------- Step
def test_step_decays_every_step_size_epochs() -> None:
    scheduler = bound(Step(step_size=3, gamma=0.5), steps_per_epoch=10, total_steps=100)
    assert scheduler.lr(0) == BASE
    assert scheduler.lr(29) == BASE  # last step of epoch 2
    assert scheduler.lr(30) == pytest.approx(BASE * 0.5)  # first step of epoch 3
    assert scheduler.lr(59) == pytest.approx(BASE * 0.5)
    assert scheduler.lr(60) == pytest.approx(BASE * 0.25)
    assert scheduler.lr(99) == pytest.approx(BASE * 0.125)


def test_step_size_steps_counts_optimisation_steps() -> None:
    scheduler = bound(Step(step_size_steps=7), steps_per_epoch=10, total_steps=100)
    assert scheduler.lr(6) == BASE
    assert scheduler.lr(7) == pytest.approx(BASE * 0.1)
    assert scheduler.lr(14) == pytest.approx(BASE * 0.01)


# ----------------------------------------------------------------------------------------------- Cosine
def test_cosine_warms_up_linearly_over_warmup_epochs() -> None:
    scheduler = bound(Cosine(warmup_epochs=1), steps_per_epoch=10, total_steps=110)
    assert scheduler.lr(0) == pytest.approx(BASE / 10)  # (step + 1) / warmup: never exactly 0
    assert scheduler.lr(4) == pytest.approx(BASE * 5 / 10)
    assert scheduler.lr(9) == pytest.approx(BASE)  # warmup end
    assert scheduler.lr(10) == pytest.approx(BASE)  # cosine start


def test_cosine_anneals_to_min_lr_through_the_midpoint() -> None:
    min_lr = 1e-5
    scheduler = bound(Cosine(warmup_epochs=1, min_lr=min_lr), steps_per_epoch=10, total_steps=110)
    assert scheduler.lr(60) == pytest.approx((BASE + min_lr) / 2)  # halfway through the 100 cosine steps
    assert scheduler.lr(35) == pytest.approx(min_lr + (BASE - min_lr) * (1 + math.cos(math.pi / 4)) / 2)
    assert min_lr < scheduler.lr(109) < min_lr + 1e-3 * (BASE - min_lr)
    assert scheduler.lr(110) == pytest.approx(min_lr)
    assert scheduler.lr(1000) == pytest.approx(min_lr)
    values = [scheduler.lr(s) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(values))


def test_cosine_warmup_steps_wins_over_warmup_epochs() -> None:
    scheduler = bound(Cosine(warmup_epochs=5, warmup_steps=4), steps_per_epoch=10, total_steps=104)
    assert scheduler.lr(0) == pytest.approx(BASE / 4)
    assert scheduler.lr(3) == pytest.approx(BASE)
    assert scheduler.lr(54) == pytest.approx(BASE / 2)


def test_cosine_without_warmup_starts_at_base_lr() -> None:
    scheduler = bound(Cosine(), steps_per_epoch=10, total_steps=100)
    assert scheduler.lr(0) == BASE
    assert scheduler.lr(50) == pytest.approx(BASE / 2)
    assert scheduler.lr(100) == pytest.approx(0.0, abs=1e-18)


def test_cosine_fractional_warmup_epochs_round_to_steps() -> None:
    scheduler = bound(Cosine(warmup_epochs=0.5), steps_per_epoch=10, total_steps=100)
    assert scheduler.lr(0) == pytest.approx(BASE / 5)
    assert scheduler.lr(4) == pytest.approx(BASE)


@given(
    warmup=st.integers(0, 50), extra=st.integers(0, 200), step=st.integers(0, 400),
    min_fraction=st.floats(0.0, 1.0), base_lr=st.floats(1e-6, 10.0),
)
def test_cosine_stays_between_min_lr_and_base_lr(warmup: int, extra: int, step: int, min_fraction: float,
                                                 base_lr: float) -> None:
    min_lr = base_lr * min_fraction
    scheduler = bound(Cosine(warmup_steps=warmup, min_lr=min_lr), steps_per_epoch=7,
                      total_steps=max(1, warmup + extra), base_lr=base_lr)
    value = scheduler.lr(step)
    low = 0.0 if step < warmup else min_lr
    assert low * (1 - 1e-12) <= value <= base_lr * (1 + 1e-12)


# ----------------------------------------------------------------------------------------------- validation
BAD_ARGUMENTS: list[tuple[Callable[[], Scheduler], str]] = [
    (lambda: Step(), "exactly one"),
    (lambda: Step(step_size=2, step_size_steps=5), "exactly one"),
    (lambda: Step(step_size=0), "step_size"),
    (lambda: Step(step_size=1.5), "step_size"),  # type: ignore[arg-type]
    (lambda: Step(step_size_steps=-3), "step_size_steps"),
    (lambda: Step(step_size=1, gamma=0.0), "gamma"),
    (lambda: Step(step_size=1, gamma=float("nan")), "gamma"),
    (lambda: Cosine(warmup_epochs=-1), "warmup_epochs"),
    (lambda: Cosine(warmup_epochs=float("inf")), "warmup_epochs"),
    (lambda: Cosine(warmup_steps=-5), "warmup_steps"),
    (lambda: Cosine(warmup_steps=2.5), "warmup_steps"),  # type: ignore[arg-type]
    (lambda: Cosine(min_lr=-1e-4), "min_lr"),
    # numbers are numbers: a string or a bool is refused, not converted
    (lambda: Cosine(min_lr="0"), r"Cosine: min_lr must be a finite number >= 0; got '0' \(str\)"),  # type: ignore[arg-type]
    (lambda: Cosine(warmup_epochs=True), r"warmup_epochs must be a finite number >= 0; got True \(bool\)"),
    (lambda: Step(step_size=1, gamma="0.5"), r"Step: gamma must be a finite number > 0; got '0.5'"),  # type: ignore[arg-type]
    (lambda: Step(step_size=True), "step_size"),
]


@pytest.mark.parametrize(("make", "name"), BAD_ARGUMENTS, ids=[f"{i}-{n}" for i, (_, n) in enumerate(BAD_ARGUMENTS)])
def test_bad_arguments_raise_value_error_naming_them(make: Callable[[], Scheduler], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        make()


def test_warmup_longer_than_training_fails_at_bind() -> None:
    scheduler = Cosine(warmup_epochs=3)
    with pytest.raises(ValueError, match=r"warmup of 30 steps .* longer than training \(20 steps\)"):
        scheduler.bind(BASE, 10, 20)
    with pytest.raises(ValueError, match="warmup_steps=21"):
        Cosine(warmup_steps=21).bind(BASE, 10, 20)
    Cosine(warmup_steps=20).bind(BASE, 10, 20)  # warmup filling the whole run is allowed


def test_min_lr_above_base_lr_fails_at_bind() -> None:
    with pytest.raises(ValueError, match="min_lr"):
        Cosine(min_lr=1.0).bind(0.1, 10, 100)


@pytest.mark.parametrize(
    ("base_lr", "steps_per_epoch", "total_steps", "name"),
    [(0.0, 10, 100, "base_lr"), (-1.0, 10, 100, "base_lr"), (BASE, 0, 100, "steps_per_epoch"),
     (BASE, 10, 0, "total_steps"), (BASE, 10, 2.5, "total_steps")],
)
def test_bad_binding_raises(base_lr: float, steps_per_epoch: int, total_steps: int, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Constant().bind(base_lr, steps_per_epoch, total_steps)


def test_lr_before_bind_and_negative_step_raise() -> None:
    with pytest.raises(RuntimeError, match="bind"):
        Cosine().lr(0)
    with pytest.raises(ValueError, match="step"):
        bound(Cosine()).lr(-1)


# ----------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize(
    "original", [Constant(), Step(step_size=2, gamma=0.3), Step(step_size_steps=9),
                 Cosine(warmup_epochs=1.5, min_lr=1e-6), Cosine(warmup_steps=12)],
    ids=repr,
)
def test_state_dict_round_trip_gives_the_same_schedule(original: Scheduler) -> None:
    bound(original)
    restored = type(original)() if not isinstance(original, Step) else Step(step_size=99)
    restored.load_state_dict(original.state_dict())
    assert restored.get_config() == original.get_config()
    bound(restored)
    assert [restored.lr(s) for s in range(0, 120, 7)] == [original.lr(s) for s in range(0, 120, 7)]


def test_load_state_dict_into_a_bound_scheduler_keeps_its_run() -> None:
    scheduler = bound(Cosine(), steps_per_epoch=10, total_steps=100)
    scheduler.load_state_dict(Cosine(warmup_steps=10).state_dict())
    assert scheduler.total_steps == 100
    assert scheduler.lr(0) == pytest.approx(BASE / 10)


def test_load_state_dict_rejects_another_scheduler() -> None:
    with pytest.raises(ValueError, match="Step"):
        Cosine().load_state_dict(Step(step_size=1).state_dict())
