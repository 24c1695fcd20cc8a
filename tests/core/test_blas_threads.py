"""blas_threads.matmul: small products run on one OpenBLAS thread, the count always comes back, results unchanged."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

from neuroflow.backends import blas_threads, cpu

pytestmark = pytest.mark.skipif(cpu.openblas_threads() is None, reason="numpy is not built with OpenBLAS")


@pytest.fixture
def two_threads() -> Any:
    """OpenBLAS on two threads for the test (CI may start it on one), put back after."""
    before = cpu.openblas_threads()
    cpu.set_openblas_threads(2)
    yield
    cpu.set_openblas_threads(before)


class Seen(np.ndarray):
    """An array that records OpenBLAS's thread count whenever a ufunc (matmul is one) runs on it."""

    counts: list[int] = []

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if ufunc is np.matmul:
            Seen.counts.append(cpu.openblas_threads())
        plain = [i.view(np.ndarray) if isinstance(i, Seen) else i for i in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(o.view(np.ndarray) if isinstance(o, Seen) else o for o in kwargs["out"])
        return getattr(ufunc, method)(*plain, **kwargs)


def seen(shape: tuple[int, ...], seed: int = 0) -> Seen:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32).view(Seen)


@pytest.mark.parametrize(("a", "b", "expected"), [
    ((3, 4), (4, 5), 60), ((7, 3, 4), (4, 5), 420), ((2, 3, 4), (2, 4, 5), 120), ((4,), (4, 5), 20),
    ((3, 4), (4,), 12), ((1, 3, 4), (6, 4, 2), 144),
])
def test_work_counts_multiply_adds_with_numpys_shapes(a: tuple[int, ...], b: tuple[int, ...], expected: int) -> None:
    assert blas_threads.work(np.empty(a), np.empty(b)) == expected
    assert np.matmul(np.ones(a), np.ones(b)).size * a[-1] == expected


def test_a_small_product_runs_on_one_thread_and_the_count_comes_back(two_threads: None) -> None:
    a, b = seen((576, 64)), seen((64, 64), 1)  # 2.4 M multiply-adds: under the grain
    assert blas_threads.OPENBLAS_SERIAL < blas_threads.work(a, b) < blas_threads.GEMM_GRAIN
    Seen.counts = []
    got = blas_threads.matmul(np, a, b)
    assert Seen.counts == [1]
    assert cpu.openblas_threads() == 2
    np.testing.assert_array_equal(got.view(np.ndarray), a.view(np.ndarray) @ b.view(np.ndarray))


def test_a_replayed_call_makes_the_same_choice_every_time(two_threads: None) -> None:
    a, b = seen((576, 64)), seen((64, 64), 1)
    out = np.empty((576, 64), np.float32)
    call = blas_threads.matmul_call(a, b, out)
    Seen.counts = []
    call()
    call()
    assert Seen.counts == [1, 1] and cpu.openblas_threads() == 2
    np.testing.assert_array_equal(out, a.view(np.ndarray) @ b.view(np.ndarray))
    tiny = blas_threads.matmul_call(seen((8, 8)), seen((8, 8), 1), np.empty((8, 8), np.float32))
    assert tiny.func is np.matmul  # OpenBLAS keeps it on one thread itself: nothing to hold


def test_a_product_worth_two_threads_keeps_them(two_threads: None) -> None:
    a, b = seen((2048, 128)), seen((128, 64), 1)  # 16.8 M multiply-adds: two grains
    Seen.counts = []
    blas_threads.matmul(np, a, b)
    assert Seen.counts == [2]


def test_products_openblas_keeps_serial_itself_are_left_alone(two_threads: None, monkeypatch: Any) -> None:
    calls: list[int] = []
    monkeypatch.setattr(blas_threads, "set_openblas_threads", lambda count: calls.append(count) or True)
    blas_threads.matmul(np, np.ones((32, 32), np.float32), np.ones((32, 32), np.float32))
    assert calls == []


def test_results_are_bit_for_bit_those_of_two_threads(two_threads: None) -> None:
    rng = np.random.default_rng(3)
    for shape_a, shape_b in [((576, 64), (64, 64)), ((144, 384), (384, 128)), ((2304, 9), (9, 32))]:
        a, b = rng.standard_normal(shape_a).astype(np.float32), rng.standard_normal(shape_b).astype(np.float32)
        out = np.empty((shape_a[0], shape_b[1]), np.float32)
        assert blas_threads.matmul(np, a, b, out=out) is out
        np.testing.assert_array_equal(out, np.matmul(a, b))


def test_an_error_inside_the_product_puts_the_count_back(two_threads: None) -> None:
    a = np.ones((600, 64), np.float32)
    with pytest.raises(ValueError):
        blas_threads.matmul(np, a, np.ones((64, 64), np.float32), out=np.empty((600, 63), np.float32))
    assert cpu.openblas_threads() == 2


def test_many_threads_at_once_share_the_lowering_and_the_count_comes_back(two_threads: None) -> None:
    a, b = np.ones((576, 64), np.float32), np.ones((64, 64), np.float32)
    big = np.ones((2048, 128), np.float32), np.ones((128, 64), np.float32)
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            for _ in range(200):
                got = blas_threads.matmul(np, *((a, b) if k % 2 else big))
                assert got[0, 0] == (64 if k % 2 else 128)
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            errors.append(error)

    workers = [threading.Thread(target=run, args=(k,)) for k in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert errors == []
    assert cpu.openblas_threads() == 2


def test_a_user_limit_of_one_thread_is_left_as_it_is(monkeypatch: Any) -> None:
    calls: list[int] = []
    monkeypatch.setattr(blas_threads, "openblas_threads", lambda: 1)
    monkeypatch.setattr(blas_threads, "set_openblas_threads", lambda count: calls.append(count) or True)
    blas_threads.matmul(np, np.ones((576, 64), np.float32), np.ones((64, 64), np.float32))
    assert calls == []


def test_another_blas_and_another_namespace_are_called_as_they_are(monkeypatch: Any) -> None:
    monkeypatch.setattr(blas_threads, "openblas_threads", lambda: None)
    monkeypatch.setattr(blas_threads, "set_openblas_threads", lambda count: pytest.fail("lowered another BLAS"))
    a, b = np.ones((576, 64), np.float32), np.ones((64, 64), np.float32)
    np.testing.assert_array_equal(blas_threads.matmul(np, a, b), a @ b)

    class Namespace:
        @staticmethod
        def matmul(x: Any, y: Any, out: Any = None) -> str:
            return "namespace"

    assert blas_threads.matmul(Namespace, a, b) == "namespace"


def test_a_count_set_while_lowered_stands_after_the_product(two_threads: None) -> None:
    """A limit another thread sets meanwhile (threadpoolctl, openblas_set_num_threads) is not overwritten."""
    assert blas_threads._lower_to(1)  # noqa: SLF001 - a product in flight in another thread
    try:
        cpu.set_openblas_threads(3)
    finally:
        blas_threads._put_back()  # noqa: SLF001
    assert cpu.openblas_threads() == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_child_forked_while_the_count_is_lowered_gets_it_back(two_threads: None) -> None:
    assert blas_threads._lower_to(1)  # noqa: SLF001 - the state a fork from inside a product would copy
    try:
        assert cpu.openblas_threads() == 1
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through its exit status
            os._exit(0 if cpu.openblas_threads() == 2 else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        blas_threads._put_back()  # noqa: SLF001
    assert os.waitstatus_to_exitcode(status) == 0
    assert cpu.openblas_threads() == 2
