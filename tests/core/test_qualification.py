"""Qualification: a device is used only after a child process trained on it correctly; a driver that crashes,
hangs or computes wrong results is refused with a message that says which, and never takes the user's process.

The backends here are a third party's, as a user installs one: a module and a ``.dist-info`` with a
``neuroflow_backends`` entry point, on the path of the process (and so of its children). Each crashes on
purpose where a driver would: its first copy to the device.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from neuroflow import registry
from neuroflow.backends import qualification, verdicts
from neuroflow.backends.selection import _instance, get_backend
from neuroflow.errors import BackendUnavailableError

PLUGIN = '''
"""Fake third-party backends: cpu arithmetic, with the failures of a bad driver."""
import os
import signal
import time

import numpy as np

from neuroflow.backends.cpu import CpuBackend


def _opened(name, index):
    marker = os.environ.get("FAKE_BACKEND_MARKERS")
    if marker:
        with open(os.path.join(marker, f"{name}-{index}-{os.getpid()}"), "w"):
            pass


class Qualified(CpuBackend):
    needs_qualification = True

    def __init__(self, index=0):
        super().__init__(index)
        _opened(self.name, index)


class GoodBackend(Qualified):
    name = "good"


class SegvBackend(Qualified):
    name = "segv"

    def from_host(self, array):  # its first kernel launch
        os.kill(os.getpid(), signal.SIGSEGV)


class HangBackend(Qualified):
    name = "hang"

    def from_host(self, array):
        time.sleep(3600)


class WrongBackend(Qualified):
    name = "wrong"

    def from_host(self, array):
        array = np.asarray(array)
        return array * 1.01 if array.dtype.kind == "f" else array


class HangTwoBackend(Qualified):
    """Two devices whose driver never answers."""

    name = "hangtwo"

    @classmethod
    def device_count(cls):
        return 2

    def from_host(self, array):
        time.sleep(3600)


class NoisyBackend(Qualified):
    """A driver that floods its output, then exits without a verdict."""

    name = "noisy"

    def from_host(self, array):
        import sys

        print("x" * 20_000_000)
        print("E" * 200_000, file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(7)


class BrokenBackend(Qualified):
    name = "broken"

    def __init__(self, index=0):
        raise RuntimeError("clCreateContext failed: -6")


class MultiBackend(Qualified):
    """Three devices; the second one's driver crashes."""

    name = "multi"

    @classmethod
    def device_count(cls):
        return 3

    @classmethod
    def device_identity(cls, index):
        return {"backend": cls.name, "device": f"card {index}", "platform version": f"FakeCL {index}.0"}

    @classmethod
    def driver_help(cls, index):
        return "install FakeCL 2.0"

    def from_host(self, array):
        if self.index == 1:
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().from_host(array)
'''

NAMES = ("good", "segv", "hang", "wrong", "broken", "multi", "hangtwo", "noisy")
CLASSES = {"good": "GoodBackend", "segv": "SegvBackend", "hang": "HangBackend", "wrong": "WrongBackend",
           "broken": "BrokenBackend", "multi": "MultiBackend", "hangtwo": "HangTwoBackend", "noisy": "NoisyBackend"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the fake distribution, as site-packages would."""
    root = tmp_path_factory.mktemp("site")
    (root / "fake_backends.py").write_text(PLUGIN)
    info = root / "fake_backends-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-backends\nVersion: 1.0\n")
    entries = "".join(f"{name} = fake_backends:{cls}\n" for name, cls in CLASSES.items())
    (info / "entry_points.txt").write_text(f"[neuroflow_backends]\n{entries}")
    return root


@pytest.fixture
def plugins(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The fake backends registered in this process (their children import them), a fresh cache."""
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("NEUROFLOW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(qualification.TIMEOUT_VAR, "30")  # "hang" is qualified by doctor too: bound its wait
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("FAKE_BACKEND_MARKERS", str(markers))
    import fake_backends

    for name, cls in CLASSES.items():
        registry.backends.register(name, getattr(fake_backends, cls))
    _instance.cache_clear()
    yield markers
    for name in NAMES:
        registry.backends.unregister(name)
    registry.backends.reset()  # entry points found while the fake distribution was on the path go too
    _instance.cache_clear()


def opened_here(markers: Path) -> list[str]:
    """The fake devices this process opened (the children open theirs in their own processes)."""
    return sorted(p.name.rsplit("-", 1)[0] for p in markers.iterdir() if p.name.endswith(f"-{os.getpid()}"))


def test_a_backend_that_passes_is_used_and_its_verdict_cached(plugins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = get_backend("good")
    assert backend.device == "good:0" and opened_here(plugins) == ["good-0"]
    verdict = qualification.verdict("good", 0)
    assert verdict.ok and verdict.stage == "train mlp adam" and verdict.seconds > 0

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached verdict ran the child again")

    monkeypatch.setattr(qualification, "run_child", no_child)
    _instance.cache_clear()
    assert get_backend("good").device == "good:0"


def test_a_driver_that_crashes_is_refused_and_this_process_lives(plugins: Path) -> None:
    with pytest.raises(BackendUnavailableError) as info:
        get_backend("segv")
    message = str(info.value)
    assert "there is no segv device 0 that qualified (0 of 1 did)" in message
    assert "crashed in stage 'train mlp sgd': the child died of SIGSEGV" in message
    assert "neuroflow doctor" in message
    assert opened_here(plugins) == []  # refused: never opened in the user's process
    cached = json.loads((qualification.cache_dir() / qualification.CACHE_FILE).read_text())
    assert [v["status"] for v in cached.values()] == ["crashed"]


def test_a_driver_that_hangs_is_killed_after_the_timeout(plugins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(qualification.TIMEOUT_VAR, "4")
    verdict = qualification.verdict("hang", 0)
    assert verdict.status == "hung" and verdict.stage == "train mlp sgd"
    assert "no answer after 4 s" in verdict.explain() and verdict.seconds < 30
    with pytest.raises(BackendUnavailableError, match="hung in stage 'train mlp sgd'"):
        get_backend("hang")


def test_a_driver_that_computes_wrong_results_is_refused(plugins: Path) -> None:
    with pytest.raises(BackendUnavailableError, match=r"wrong in stage 'train mlp sgd': training an MLP with sgd: "
                                                      r"loss .* at step \d, cpu gives"):
        get_backend("wrong")


def test_a_device_that_cannot_open_says_why(plugins: Path) -> None:
    with pytest.raises(BackendUnavailableError,
                       match=r"failed in stage 'open device': RuntimeError: clCreateContext failed: -6"):
        get_backend("broken")


def test_names_count_the_qualified_devices_only(plugins: Path) -> None:
    """card 1 crashes: multi:0 is card 0, multi:1 is card 2, multi:2 names the refused one and its help."""
    assert get_backend("multi:0").index == 0
    second = get_backend("multi:1")
    assert second.index == 2 and second.device == "multi:1"
    with pytest.raises(BackendUnavailableError) as info:
        get_backend("multi:2")
    message = str(info.value)
    assert "found multi:0 = card 0 (FakeCL 0.0), multi:1 = card 2 (FakeCL 2.0)" in message
    assert "refused: card 1 (FakeCL 1.0): crashed" in message and "install FakeCL 2.0" in message
    assert opened_here(plugins) == ["multi-0", "multi-2"]


def test_two_processes_qualifying_at_once_keep_both_verdicts(plugins: Path) -> None:
    threads = [threading.Thread(target=qualification.verdict, args=(name, 0)) for name in ("good", "wrong")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(v.status for v in qualification.cached().values())
    assert statuses == ["ok", "wrong"]


def test_a_new_source_of_the_backend_is_qualified_again(plugins: Path, site: Path) -> None:
    import fake_backends

    before = qualification.key(fake_backends.GoodBackend, 0)
    path = site / "fake_backends.py"
    original = path.read_text()
    try:
        path.write_text(original + "\n# a kernel changed\n")
        verdicts.package_hash.cache_clear()
        assert qualification.key(fake_backends.GoodBackend, 0) != before
    finally:
        path.write_text(original)
        verdicts.package_hash.cache_clear()


def test_requalify_forgets_every_verdict(plugins: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from neuroflow.cli.main import main

    monkeypatch.setenv(qualification.TIMEOUT_VAR, "4")
    first = qualification.verdict("good", 0)
    assert main(["doctor"]) == 0
    assert qualification.verdict("good", 0) == first  # doctor read the cache: no second run
    out = capsys.readouterr().out
    assert "hung in stage 'train mlp sgd': no answer after 4 s" in out and "multi:1" in out
    qualification.forget()
    assert not qualification.cached()
    monkeypatch.setattr(qualification, "run_child", lambda name, index, **_: qualification.Verdict(
        name, index, {}, "failed", "requalified"))
    assert main(["doctor", "--requalify"]) == 0
    assert "failed: requalified" in capsys.readouterr().out


def _run(site: Path, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path]),
                   "NEUROFLOW_CACHE_DIR": str(tmp_path / "cache"), **(env or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=environment, timeout=900)


TRAIN = textwrap.dedent("""
    import numpy as np
    import neuroflow as nf
    x = np.random.default_rng(0).standard_normal((64, 20)).astype(np.float32)
    y = np.arange(64) % 3
    trainer = nf.Trainer(nf.Sequential(nf.ops.Linear(20, 3)), progress=False, batch_size=32)
    losses = [trainer.train_step(x, y) for _ in range(3)]
    assert losses[-1] < losses[0]
    import os
    print("process", os.getpid())
    print("trained on", trainer.backend.name)
""")


def test_auto_never_runs_a_crashing_plugin_in_the_users_process(site: Path, tmp_path: Path) -> None:
    """The done-means: a third-party backend whose first launch raises SIGSEGV leaves NEUROFLOW_BACKEND=auto
    training (on cpu, or on a real backend that beat it), and doctor shows it as crashed."""
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {"NEUROFLOW_BACKEND": "auto", "FAKE_BACKEND_MARKERS": str(markers), "NEUROFLOW_QUALIFY_TIMEOUT": "20"}
    trained = _run(site, tmp_path, "-c", TRAIN, env=env)
    assert trained.returncode == 0, trained.stderr
    chosen = trained.stdout.split("trained on ")[-1].strip()
    assert chosen not in ("segv", "hang", "wrong", "broken")  # cpu, a real backend, or a fake that qualified
    record = json.loads((tmp_path / "cache" / "backend-choice.json").read_text())
    assert record["choice"] == chosen
    assert "crashed" in record["failures"]["segv"] and "SIGSEGV" in record["failures"]["segv"]
    assert "hung" in record["failures"]["hang"] and "wrong" in record["failures"]["wrong"]
    user = trained.stdout.split("process ")[1].split()[0]  # the user's process opened the chosen backend only
    assert [p.name for p in markers.iterdir() if p.name.endswith(f"-{user}")] == (
        [f"{chosen}-0-{user}"] if chosen in ("good", "multi") else [])
    assert any(p.name.startswith("segv-0-") for p in markers.iterdir())  # its child did open it
    doctor = _run(site, tmp_path, "-m", "neuroflow.cli.main", "doctor", env=env)
    assert doctor.returncode == 0, doctor.stderr
    lines = {line.split()[0]: line for line in doctor.stdout.splitlines() if line.startswith("  ") and line.split()}
    assert "crashed in stage 'train mlp sgd': the child died of SIGSEGV" in lines["segv"]
    assert "fake-backends 1.0" in lines["segv"]
    assert "segv not chosen" in lines["auto"]
    assert "qualified (" in lines["good:0"]


def test_a_backend_defined_in_main_is_refused_with_what_to_do(plugins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from neuroflow.backends.cpu import CpuBackend

    class Mine(CpuBackend):
        name = "mine"

    Mine.__module__ = "__main__"  # as a class written in a script or a notebook
    registry.backends.register("mine", Mine)
    try:
        with pytest.raises(BackendUnavailableError, match=r"failed: Mine is defined in __main__, where a child "
                                                          r"process cannot import it.*needs_qualification = False"):
            get_backend("mine")
        Mine.__module__ = __name__  # importable module, but the class lives inside this function
        _instance.cache_clear()
        with pytest.raises(BackendUnavailableError, match=r"Mine is defined inside a function, where a child"):
            get_backend("mine")
        assert not qualification.cached()  # not the device's verdict: nothing cached
        Mine.needs_qualification = False  # the escape hatch the message names
        _instance.cache_clear()
        assert get_backend("mine").device == "mine:0"
    finally:
        registry.backends.unregister("mine")


@pytest.mark.parametrize("value", ["abc", "-1", "0", "inf", "nan", "1e9"])
def test_a_bad_timeout_says_what_it_expects(plugins: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    from neuroflow.errors import ConfigError

    monkeypatch.setenv(qualification.TIMEOUT_VAR, value)
    with pytest.raises(ConfigError, match=rf"NEUROFLOW_QUALIFY_TIMEOUT='{value}'; expected the seconds .* a "
                                          r"positive number up to 86400 \(default 600\)"):
        qualification.run_child("good", 0)


def test_a_hung_verdict_is_tried_again_under_a_longer_timeout(plugins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(qualification.TIMEOUT_VAR, "2")
    assert qualification.verdict("hang", 0).status == "hung"
    calls = []
    monkeypatch.setattr(qualification, "run_child", lambda name, index, **kw: calls.append(kw) or qualification.Verdict(
        name, index, {}, "hung", "again", timeout=kw["timeout"]))
    assert qualification.verdict("hang", 0).detail.startswith("no answer after 2 s")  # the same bound: cached
    monkeypatch.setenv(qualification.TIMEOUT_VAR, "3")
    assert qualification.verdict("hang", 0).detail == "again" and calls == [{"timeout": 3.0}]


def test_a_flood_of_output_is_bounded_and_not_cached(plugins: Path) -> None:
    verdict = qualification.verdict("noisy", 0)
    assert verdict.status == "failed" and "exited with code 7 without a verdict" in verdict.detail
    assert len(verdict.detail) < 1000
    assert not qualification.cached()  # an exception or an exit, not a driver's crash: found again next time


def test_a_cache_entry_of_the_wrong_shape_is_no_verdict(plugins: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    qualification.verdict("good", 0)
    path = qualification.cache_dir() / qualification.CACHE_FILE
    data = json.loads(path.read_text())
    runs = []
    real = qualification.run_child
    monkeypatch.setattr(qualification, "run_child", lambda *a, **kw: runs.append(a) or real(*a, **kw))
    for bad in ({"identity": "x"}, {"seconds": "abc"}, {"status": 5}, {"index": "0"}):
        (k, record), = data.items()
        path.write_text(json.dumps({k: {**record, **bad}}))
        before = len(runs)
        assert qualification.verdict("good", 0).ok
        assert len(runs) == before + 1, bad  # qualified again, not read
    path.write_text("[1, 2")
    assert qualification.verdict("good", 0).ok


def test_a_module_in_the_working_directory_does_not_shadow_the_childs_imports(plugins: Path, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    trap = tmp_path / "trap"
    trap.mkdir()
    (trap / "numpy.py").write_text("raise ImportError('a stray numpy.py in the working directory')\n")
    monkeypatch.chdir(trap)
    assert qualification.verdict("good", 0).ok


SUPERVISED = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import fake_backends
    from neuroflow import registry
    from neuroflow.backends.selection import get_backend
    registry.backends.register("hangtwo", fake_backends.HangTwoBackend)
    print("ready", flush=True)
    get_backend("hangtwo")
""")


@pytest.mark.parametrize("how", ["interrupt"])  # SIGKILL (PR_SET_PDEATHSIG) checked by hand: flaky to observe here
def test_the_children_end_with_their_parent(site: Path, tmp_path: Path, how: str) -> None:
    """Ctrl-C reaches a process qualifying two devices at once within a second or so, and a parent killed with
    SIGKILL takes its children with it: no child is left running, stuck in its driver."""
    import signal
    import time

    env = {**os.environ, "NEUROFLOW_CACHE_DIR": str(tmp_path / "cache"), qualification.TIMEOUT_VAR: "120"}
    user = subprocess.Popen([sys.executable, "-c", SUPERVISED, str(site)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert user.stdout.readline().strip() == "ready"

        def children() -> list[str]:
            found = subprocess.run(["pgrep", "-f", f"neuroflow.probe hangtwo .*{tmp_path.name}|neuroflow.probe hangtwo"],
                                   capture_output=True, text=True).stdout.split()
            return [pid for pid in found if Path(f"/proc/{pid}/environ").exists()
                    and str(tmp_path / "cache").encode() in Path(f"/proc/{pid}/environ").read_bytes()]

        deadline = time.monotonic() + 60
        while len(children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(children()) == 2
        sent = time.monotonic()
        user.send_signal(signal.SIGINT if how == "interrupt" else signal.SIGKILL)
        try:  # communicate, not wait: the child's stderr is drained, so a long message cannot block it on a full pipe
            _, stderr = user.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            user.kill()
            _, stderr = user.communicate()
            pytest.fail(f"the process did not end within 30 s of SIGINT; its stderr ends with: {stderr[-3000:]}")
        if how == "interrupt":
            assert time.monotonic() - sent < 5 and "KeyboardInterrupt" in stderr, stderr[-3000:]
        deadline = time.monotonic() + 10
        while children() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert children() == []
        assert not (tmp_path / "cache" / qualification.CACHE_FILE).exists()  # no verdict from a killed run
    finally:
        user.kill()
