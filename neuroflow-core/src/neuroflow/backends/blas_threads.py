"""numpy's OpenBLAS runs its parallel work on threads that sleep when idle, so no core spins beside the pool.

numpy's OpenBLAS (a pthreads build) keeps each of its worker threads
busy-waiting for 2^28 cycles (~0.1 s) after every threaded call, so that the
next call finds it awake; the timeout is read once, from
``OPENBLAS_THREAD_TIMEOUT``, when numpy loads the library. A training step
calls a GEMM every few milliseconds, so a core is always taken by a spinning
worker, and the elementwise work :mod:`neuroflow.backends.cpu_parallel`
splits between the cores gets half of it: on the small CNN of
``benchmarks/cnn.py`` (2 threads, 2-core EPYC) splitting that work gained
nothing (89.5 ms a step with the pool, 89.6 without), while the same step
with the spinning cut short (``OPENBLAS_THREAD_TIMEOUT=4`` before numpy
loads) took 78.8 ms.

OpenBLAS (0.3.27 on) lets the caller run those jobs instead:
``openblas_set_threads_callback_function``. :func:`share` registers a
callback that hands each parallel region of OpenBLAS to NeuroFlow's own
threads, which block on a queue when idle: a *leader* takes regions one at a
time, gives jobs 1…n−1 to *followers* and runs job 0 itself. The jobs of a
region wait for each other inside OpenBLAS, so they must run at once: the
leader's crew never runs anything else, and regions never overlap (OpenBLAS
serialises its level-3 calls itself, not its level-2 ones). The calling
thread only posts the region and waits. A signal handler that raises while
it waits (Ctrl-C) cannot end the wait early, since OpenBLAS's job data lives
on the caller's stack until every job is done: the exception is held, and
once the region is done it is raised again in the caller's own code (a
KeyboardInterrupt; another exception is reported and dropped). Python may
also run a handler the moment the callback is entered, before any job is
posted; OpenBLAS cannot be told, and would return a wrong product, so then
the process ends with a message (exit 130 for Ctrl-C) instead. That takes a
signal arriving inside numpy's call just before OpenBLAS splits its work: a
window of microseconds against the milliseconds a product takes.

Waking a sleeping thread costs tens of microseconds where a spinning one
answers at once: a small threaded GEMM (64×784 by 784×128, 2 threads) takes
~45 µs longer. So :func:`share` runs only when :mod:`~neuroflow.backends.
cpu_parallel` first starts its workers, i.e. when elementwise work is large
enough to split (convolutional maps), never for an MLP whose arrays stay under
its threshold. ``NEUROFLOW_SHARE_BLAS_THREADS=0`` keeps OpenBLAS's own
threads; other BLAS libraries (MKL, Accelerate) and OpenBLAS builds without
the callback are left as they are. A forked child gets a new crew on its
first region; at exit the callback is removed before the crew stops.
"""

from __future__ import annotations

import _thread
import atexit
import ctypes
import os
import queue
import sys
import threading
import time
from typing import Any, NoReturn

from neuroflow.backends.cpu import openblas_library

#: Environment variable: "0" keeps OpenBLAS's own (spinning) worker threads.
VARIABLE = "NEUROFLOW_SHARE_BLAS_THREADS"

_SETTERS = ("scipy_openblas_set_threads_callback_function64_", "scipy_openblas_set_threads_callback_function",
            "openblas_set_threads_callback_function64_", "openblas_set_threads_callback_function")
_DOJOB = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, _DOJOB, ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int)


class _Region:
    """One parallel region of OpenBLAS: ``count`` jobs, job ``i`` at ``data + i·size``, all to run at once."""

    def __init__(self, dojob: Any, count: int, size: int, data: int, extra: int) -> None:
        self.dojob, self.count, self.size, self.data, self.extra = dojob, count, size, data, extra
        self.taken = False  # a second post of the same region (see _callback) is dropped by the leader
        self.done = threading.Event()

    def run(self, index: int) -> None:
        self.dojob(index, self.data + index * self.size, self.extra)  # ctypes releases the GIL for the call


class _Crew:
    """The leader thread and its followers, for one process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.inbox: queue.SimpleQueue[_Region | None] = queue.SimpleQueue()
        self.finished: queue.SimpleQueue[None] = queue.SimpleQueue()
        self.followers: list[queue.SimpleQueue[tuple[_Region, int] | None]] = []
        self.regions = 0
        self.interrupts: queue.SimpleQueue[None] = queue.SimpleQueue()
        threading.Thread(target=self._lead, name="neuroflow-blas-0", daemon=True).start()
        threading.Thread(target=_interrupt_main_outside, args=(self.interrupts,), name="neuroflow-blas-interrupt",
                         daemon=True).start()

    def _lead(self) -> None:
        while True:
            region = self.inbox.get()
            if region is None:
                return
            if region.taken:
                continue
            region.taken = True
            try:
                self._enlist(region.count - 1)
            except BaseException as raised:  # noqa: BLE001 - no thread for a job: OpenBLAS would wait for ever
                _fatal(f"could not start a thread for OpenBLAS's jobs ({raised!r})")
            for index in range(1, region.count):
                self.followers[index - 1].put((region, index))
            region.run(0)
            for _ in range(1, region.count):
                self.finished.get()
            self.regions += 1
            region.done.set()

    def _enlist(self, count: int) -> None:
        while len(self.followers) < count:
            jobs: queue.SimpleQueue[tuple[_Region, int] | None] = queue.SimpleQueue()
            name = f"neuroflow-blas-{len(self.followers) + 1}"
            threading.Thread(target=self._follow, args=(jobs,), name=name, daemon=True).start()
            self.followers.append(jobs)

    def _follow(self, jobs: queue.SimpleQueue[tuple[_Region, int] | None]) -> None:
        while True:
            item = jobs.get()
            if item is None:
                return
            region, index = item
            region.run(index)
            del region, item  # hold nothing of a finished region while waiting
            self.finished.put(None)

    def stop(self) -> None:
        for jobs in self.followers:
            jobs.put(None)
        self.inbox.put(None)


_crew: _Crew | None = None
_crew_lock = threading.Lock()
_setter: Any = None
_installed = False
_previous_hook = sys.unraisablehook


def _the_crew() -> _Crew:
    global _crew
    crew = _crew
    if crew is None or crew.pid != os.getpid():  # first region, or the first in a forked child
        with _crew_lock:
            if _crew is None or _crew.pid != os.getpid():
                _crew = _Crew()
            crew = _crew
    return crew


def _fatal(message: str) -> NoReturn:
    """OpenBLAS cannot be told a region failed: results would be silently wrong, so the process ends."""
    os.write(2, f"neuroflow: {message}; set {VARIABLE}=0 to keep OpenBLAS's own threads\n".encode())
    os.abort()


class _AfterRegion(Exception):
    """What a signal handler raised while a region ran, let out of the callback once the region is done."""

    def __init__(self, held: BaseException) -> None:
        super().__init__(repr(held))
        self.held = held


def _callback(sync: int, dojob: Any, count: int, size: int, data: int, extra: int) -> None:
    region = _Region(dojob, count, size, data, extra)
    posted, held = False, None
    while not region.done.is_set():
        try:
            if not posted:
                try:
                    crew = _the_crew()
                except BaseException as raised:  # noqa: BLE001 - see _fatal
                    _fatal(f"could not start a thread for OpenBLAS's jobs ({raised!r})")
                crew.inbox.put(region)
                posted = True  # an exception between the put and here posts it again: the leader drops the copy
            region.done.wait()
        except BaseException as raised:  # noqa: BLE001 - held until the jobs, which use the caller's stack, end
            held = held or raised
    if held is not None:
        raise _AfterRegion(held)  # ctypes hands it to _on_unraisable, which raises it again after the product


def _on_unraisable(unraisable: Any) -> None:
    """ctypes reports what escaped the callback here: raise a held exception again in the caller's code; an
    exception that came before the region started (a signal handler run as the callback was entered) left
    OpenBLAS's jobs undone and its product wrong, so the process ends rather than go on with it."""
    if unraisable.object is not _callback:
        _previous_hook(unraisable)
        return
    raised = unraisable.exc_value
    if isinstance(raised, _AfterRegion):
        _deliver(raised.held)
        return
    code = 130 if isinstance(raised, KeyboardInterrupt) else 70
    os.write(2, f"neuroflow: {raised!r} was raised as OpenBLAS handed NeuroFlow's threads a product, before its "
                f"jobs ran; the process ends (exit {code}) rather than go on with a wrong result\n".encode())
    os._exit(code)


def _deliver(raised: BaseException) -> None:
    """Raise again what a signal handler raised during a region: a KeyboardInterrupt goes to the crew's
    interrupter (below); another exception is reported and dropped."""
    if not isinstance(raised, KeyboardInterrupt):
        print(f"neuroflow: {raised!r} was raised while OpenBLAS ran; held until its jobs ended, then dropped",
              file=sys.stderr)
        return
    crew = _crew
    handed = crew is None
    while crew is not None and not handed:  # a second Ctrl-C while handing the first over: one is enough
        try:
            crew.interrupts.put(None)
            handed = True
        except BaseException:  # noqa: BLE001, S110
            pass


def _interrupt_main_outside(interrupts: queue.SimpleQueue[None]) -> None:
    """Interrupt the main thread once it has left this module's code (Python runs signal handlers only there,
    at its next instruction: inside the callback it would land where it cannot escape)."""
    main = threading.main_thread().ident or 0
    while True:
        interrupts.get()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            frame = sys._current_frames().get(main)  # noqa: SLF001 - CPython's documented view of other threads
            if frame is None or frame.f_code.co_filename != __file__:
                break
            time.sleep(0.0005)
        _thread.interrupt_main()


_c_callback = _CALLBACK(_callback)  # referenced for the life of the process: OpenBLAS keeps the pointer


def _find_setter() -> Any:
    library = openblas_library()
    for symbol in _SETTERS if library is not None else ():
        setter = getattr(library, symbol, None)
        if setter is not None:
            setter.argtypes, setter.restype = [ctypes.c_void_p], None
            return setter
    return None


def available() -> bool:
    """Whether numpy's BLAS is an OpenBLAS that takes a threads callback."""
    global _setter
    if _setter is None:
        _setter = _find_setter() or False
    return bool(_setter)


def share() -> bool:
    """Run OpenBLAS's parallel jobs on NeuroFlow's threads from now on; whether they do (see the module)."""
    global _installed, _previous_hook
    if _installed:
        return True
    if os.environ.get(VARIABLE, "").strip() == "0" or not available():
        return False
    with _crew_lock:
        if not _installed:
            if sys.unraisablehook is not _on_unraisable:
                _previous_hook, sys.unraisablehook = sys.unraisablehook, _on_unraisable
            _setter(ctypes.cast(_c_callback, ctypes.c_void_p))
            _installed = True
    return True


def shared() -> bool:
    """Whether OpenBLAS's parallel jobs run on NeuroFlow's threads."""
    return _installed


def regions() -> int:
    """Parallel regions of OpenBLAS NeuroFlow's threads have run in this process."""
    return 0 if _crew is None or _crew.pid != os.getpid() else _crew.regions


def unshare() -> None:
    """Give OpenBLAS its own threads back (later calls; a region in flight finishes on NeuroFlow's)."""
    global _installed
    with _crew_lock:
        if _installed:
            _setter(None)
            _installed = False


def _at_exit() -> None:
    unshare()
    if _crew is not None and _crew.pid == os.getpid():
        _crew.stop()


atexit.register(_at_exit)
