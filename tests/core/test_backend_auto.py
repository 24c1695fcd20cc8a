"""NEUROFLOW_BACKEND=auto: measured once, cached per machine, never slower than cpu, explicit names win."""

from __future__ import annotations

import json

import pytest

from neuroflow import registry
from neuroflow.backends import auto
from neuroflow.backends.cpu import CpuBackend
from neuroflow.backends.selection import _instance, get_backend


class SlowBackend(CpuBackend):
    name = "slowdev"


class FastBackend(CpuBackend):
    name = "fastdev"


@pytest.fixture
def fake_backends(monkeypatch, tmp_path):
    monkeypatch.setenv("NEUROFLOW_CACHE_DIR", str(tmp_path))
    registry.backends.register("slowdev", SlowBackend)
    registry.backends.register("fastdev", FastBackend)
    _instance.cache_clear()
    yield tmp_path
    registry.backends.unregister("slowdev")
    registry.backends.unregister("fastdev")
    _instance.cache_clear()


def timer_from(table, calls):
    def timer(name):
        calls.append(name)
        return table[name]
    return timer


def test_a_backend_slower_than_cpu_is_never_chosen(fake_backends):
    calls: list[str] = []
    choice, record = auto.choose(["cpu", "slowdev"], timer_from({"cpu": 1e-3, "slowdev": 5e-3}, calls))
    assert choice == "cpu"
    assert record["step_seconds"] == {"cpu": 1e-3, "slowdev": 5e-3}


def test_the_fastest_backend_wins_only_by_a_clear_margin(fake_backends):
    calls: list[str] = []
    choice, _ = auto.choose(["cpu", "slowdev", "fastdev"], timer_from({"cpu": 1e-3, "slowdev": 5e-3, "fastdev": 4e-4}, calls))
    assert choice == "fastdev"
    (fake_backends / auto.CACHE_FILE).unlink()
    choice, _ = auto.choose(["cpu", "fastdev"], timer_from({"cpu": 1e-3, "fastdev": 0.97e-3}, calls))
    assert choice == "cpu"  # 3 % faster is within timing noise


def test_the_choice_is_cached_per_machine_and_remeasured_when_backends_change(fake_backends):
    calls: list[str] = []
    timer = timer_from({"cpu": 1e-3, "slowdev": 5e-3, "fastdev": 4e-4}, calls)
    assert auto.choose(["cpu", "fastdev"], timer)[0] == "fastdev"
    measured = len(calls)
    assert auto.choose(["cpu", "fastdev"], timer)[0] == "fastdev"
    assert len(calls) == measured  # read from the cache, nothing timed
    saved = json.loads((fake_backends / auto.CACHE_FILE).read_text())
    assert saved["choice"] == "fastdev" and set(saved["step_seconds"]) == {"cpu", "fastdev"}
    auto.choose(["cpu", "fastdev", "slowdev"], timer)  # another backend installed: measure again
    assert len(calls) > measured


def test_a_backend_that_fails_to_train_is_skipped_and_reported(fake_backends):
    def timer(name):
        if name == "fastdev":
            raise RuntimeError("kernel build failed")
        return 1e-3
    choice, record = auto.choose(["cpu", "fastdev"], timer)
    assert choice == "cpu"
    assert "kernel build failed" in record["failures"]["fastdev"]


def test_env_auto_uses_the_measurement_and_explicit_names_win(fake_backends, monkeypatch):
    monkeypatch.setattr(auto, "measure", lambda name, steps=12: {"cpu": 1e-3, "slowdev": 5e-3, "fastdev": 4e-4}[name])
    monkeypatch.setenv("NEUROFLOW_BACKEND", "auto")
    assert get_backend().name == "fastdev"
    assert get_backend("slowdev").name == "slowdev"
    assert get_backend("cpu").name == "cpu"


def test_real_measurement_times_every_runnable_backend(monkeypatch, tmp_path):
    monkeypatch.setenv("NEUROFLOW_CACHE_DIR", str(tmp_path))
    available = [n for n in registry.backends.names() if registry.backends.get(n).is_available()]
    choice, record = auto.choose(available, lambda name: auto.measure(name, steps=2))
    assert set(record["step_seconds"]) | set(record["failures"]) == set(available)
    assert all(seconds > 0 for seconds in record["step_seconds"].values())
    fastest = min(record["step_seconds"], key=record["step_seconds"].get)
    assert choice in ("cpu", fastest)
    if choice != "cpu":
        assert record["step_seconds"][choice] < auto.MARGIN * record["step_seconds"]["cpu"]
