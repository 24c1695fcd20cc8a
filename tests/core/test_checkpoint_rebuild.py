"""Rebuilding a model from a file: placeholders, one memory budget for every allocation, errors that name the op."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import tracemalloc

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops, registry
from neuroflow.checkpoint import CheckpointError
from neuroflow.checkpoint.allocation_guard import RebuildBudget, is_placeholder, limit_allocations
from neuroflow.checkpoint.model_file import MODEL_FORMAT, model_payload, write_model_file
from neuroflow.operator import Operator
from neuroflow.tensor import Tensor


def test_a_placeholder_holds_no_memory_whatever_its_size_and_converts_to_another():
    tracemalloc.start()
    try:
        with limit_allocations(RebuildBudget(held=10**9), source="f") as guard:
            draw = guard.uniform(-1.0, 1.0, (20_000, 20_000))  # 3.2 GB if it were an array
            draw *= 3.0  # constructors may scale their draws in place
            converted = draw.astype(np.float32)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20
    assert is_placeholder(draw) and draw.shape == (20_000, 20_000) and draw.dtype == np.float64
    assert is_placeholder(converted) and converted.shape == draw.shape and converted.dtype == np.float32
    assert draw.strides == (0, 0) and not draw[:3, :3].any()
    assert not is_placeholder(draw[:2, :2] + 1)  # arithmetic gives an ordinary array


def test_a_loaded_model_holds_the_files_values_and_no_placeholder(tmp_path):
    nf.manual_seed(3)
    model = nf.Sequential(ops.Linear(300, 40), ops.ReLU(), ops.Linear(40, 5))
    nf.save(model, tmp_path / "m.safetensors")
    for mmap in (True, False):
        loaded = nf.load(tmp_path / "m.safetensors", mmap=mmap)
        for (name, saved), (_, tensor) in zip(model.named_parameters(), loaded.named_parameters(), strict=True):
            assert type(tensor.data) is np.ndarray and tensor.data.flags.c_contiguous, name
            assert np.array_equal(tensor.data, saved.data), name


def _file_with_topology(tmp_path, edit) -> str:
    tensors, meta = model_payload(nf.Sequential(nf.Sequential(ops.Linear(2, 2), ops.ReLU())), MODEL_FORMAT, None)
    topology = json.loads(meta["topology"])
    edit(topology["root"])
    path = tmp_path / "m.safetensors"
    write_model_file(path, tensors, {**meta, "topology": json.dumps(topology)})
    return str(path)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda root: root["children"][0]["children"][1].pop("config"),
     "op model.0.1 needs a string 'type' and an object 'config'"),
    (lambda root: root["children"][0].update(children={"0": {}}), "op model.0 has 'children' that is not a list of ops"),
    (lambda root: root["children"][0]["children"][0]["config"].update(in_features=-2), "cannot rebuild op model.0.0"),
    (lambda root: root["children"][0]["children"][1].update(children=[]), "op model.0.1 (ReLU) is saved with child ops"),
])
def test_topology_errors_name_the_op_by_its_path(tmp_path, edit, message):
    with pytest.raises(CheckpointError, match=message.replace("(", r"\(").replace(")", r"\)")):
        nf.load(_file_with_topology(tmp_path, edit))


def _raw_file(tmp_path, header_json: str) -> str:
    raw = header_json.encode()
    path = tmp_path / "h.safetensors"
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(8))
    return str(path)


_SPEC = '{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'


@pytest.mark.parametrize(("header", "message"), [
    ('{"w":' + _SPEC + ',"w":' + _SPEC + '}', "header names 'w' twice"),
    ('{"__metadata__":{"format":"a","format":"b"},"w":' + _SPEC + '}', "header names 'format' twice"),
    ('{"w":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}}', "header names 'dtype' twice"),
    ("[]", "header is a JSON list; expected an object"),
    ('{"w":[["dtype","F32"]]}', "tensor 'w' is described by a list; expected an object"),
    ('{"w":{"dtype":"F32","shape":{"0":2},"data_offsets":[0,8]}}', "tensor 'w' has shape"),
    ('{"w":{"dtype":["F32"],"shape":[2],"data_offsets":[0,8]}}', "tensor 'w' has dtype"),
    ('{"__metadata__":{"format":{"a":"b"}},"w":' + _SPEC + '}', "__metadata__ must map strings to strings"),
])
def test_header_objects_are_refused_when_a_name_repeats_or_an_array_stands_in(tmp_path, header, message):
    for mmap in (True, False):
        with pytest.raises(CheckpointError, match=message.replace("[", r"\[")):
            nf.load(_raw_file(tmp_path, header), mmap=mmap)


# --------------------------------------------------------------------------- one budget for every allocation
class Tabled(Operator):
    """Makes an array of ``size`` values in its constructor the way ``how`` says, as ops and plugins do."""

    MAKERS = {
        "ones": lambda n: np.ones(n, np.float32),
        "zeros": lambda n: np.zeros(n),
        "full": lambda n: np.full(n, 0.5),
        "empty_like": lambda n: np.empty_like(np.empty(1), shape=(n,)),
        "eye": lambda n: np.eye(int(n**0.5)).reshape(-1),
        "arange": lambda n: np.arange(n, dtype=np.float64),
        "drawn_then_scaled": lambda n: nf.random.generator().standard_normal(n) * 0.1,  # arithmetic is real
    }

    def __init__(self, size: int, how: str = "ones", cache: int = 0) -> None:
        super().__init__()
        self.size, self.how, self.cache = size, how, cache
        self.register_buffer("table", Tensor(self.MAKERS[how](size).astype(np.float32)))
        try:  # a scratch array it can do without: the file's tensors do not show it
            self.scratch = np.ones(cache)
        except MemoryError:
            self.scratch = None

    def forward(self, x):
        return x

    def get_config(self):
        return {"size": self.size, "how": self.how, "cache": self.cache}


@pytest.fixture
def tabled():
    registry.ops.register("Tabled", Tabled)
    yield
    registry.ops.unregister("Tabled")


def _edited(tmp_path, model, **config) -> str:
    tensors, meta = model_payload(model, MODEL_FORMAT, None)
    topology = json.loads(meta["topology"])
    topology["root"]["children"][0]["config"].update(config)
    path = tmp_path / "m.safetensors"
    write_model_file(path, tensors, {**meta, "topology": json.dumps(topology)})
    return str(path)


@pytest.mark.parametrize(("how", "size", "asked"), [
    ("ones", 9_000_000, 36_000_000), ("zeros", 9_000_000, 72_000_000), ("full", 9_000_000, 72_000_000),
    ("empty_like", 9_000_000, 72_000_000), ("eye", 9_000_000, 72_000_000), ("arange", 9_000_000, 72_000_000),
    ("drawn_then_scaled", 1_500_000, 12_000_000),  # the draw (12 MB) fits the 16 MiB, its product does not
])
def test_every_array_a_constructor_makes_is_refused_beyond_the_budget(tmp_path, tabled, how, size, asked):
    # The size in the message is the request numpy's allocator refused, before it allocated: the file's own
    # check (the table is 9 values in the file) would have refused the model only after it was built.
    path = _edited(tmp_path, nf.Sequential(Tabled(9, how)), size=size)
    with pytest.raises(CheckpointError, match=rf"op model\.0 \(Tabled\) asks for {asked:,} bytes \(a numpy array\) "
                                              "with [0-9,]+ left of the [0-9,]+ a file of 9 values lets its model's "
                                              "rebuild allocate .*refusing to allocate them"):
        nf.load(path)
    assert nf.load(_edited(tmp_path, nf.Sequential(Tabled(9, how)))).state_dict()["0.table"].shape == (9,)  # fits


def test_a_constructor_that_catches_the_refusal_still_gets_its_file_refused(tmp_path, tabled):
    path = _edited(tmp_path, nf.Sequential(Tabled(4)), cache=10**8)
    with pytest.raises(CheckpointError, match=r"op model\.0 \(Tabled\) asks for 800,000,000 bytes \(a numpy array\)"):
        nf.load(path)


def test_draws_and_arrays_share_one_budget():
    budget = RebuildBudget(held=2**20)  # 2 x 8 bytes x 2**20 values + 16 MiB = 32 MiB
    with limit_allocations(budget, source="f") as guard:
        guard.standard_normal(2**20)  # 8 MiB, charged as a draw
        kept = np.ones(2**21)  # 16 MiB of arrays
        assert (8 << 20) - 1024 < budget.left <= 8 << 20  # and numpy's own scalars of a few bytes
        with pytest.raises(MemoryError):
            np.zeros(2**20 + 1)
    assert budget.refused is not None and budget.refused.nbytes == 8 * (2**20 + 1)
    assert kept.sum() == 2**21 and np.ones(2**22).sum() == 2**22  # after the block numpy allocates freely


def test_a_rebuild_charges_only_its_own_thread():
    budget = RebuildBudget(held=0)
    seen = {}

    def elsewhere():  # e.g. a web handler predicting while another thread loads a model
        seen["array"] = np.ones(2**22)  # 32 MiB, twice this budget
        seen["generator"] = nf.random.generator()

    with limit_allocations(budget, source="f") as guard:
        worker = threading.Thread(target=elsewhere)
        worker.start()
        worker.join()
        assert nf.random.generator() is guard
    assert seen["array"].sum() == 2**22 and not is_placeholder(seen["array"])
    assert seen["generator"] is nf.random.generator() and seen["generator"] is not guard
    assert budget.refused is None and budget.left == budget.limit


_PROBE = """
import json, resource, sys
import neuroflow as nf
from neuroflow import registry
from neuroflow.checkpoint.model_file import MODEL_FORMAT, model_payload, write_model_file
from neuroflow.operator import Operator
from neuroflow.tensor import Tensor

tensors, meta = model_payload(nf.Sequential(registry.ops.get("BatchNorm2d")(4)), MODEL_FORMAT, None)
topology = json.loads(meta["topology"])
topology["root"]["children"][0]["config"]["num_features"] = int(sys.argv[2])
write_model_file(sys.argv[1], tensors, {**meta, "topology": json.dumps(topology)})
with open("/proc/self/statm") as statm:  # a fixed address space, as the issue's probe had: an old build fails fast
    mapped = int(statm.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (mapped + (3 << 30), resource.RLIM_INFINITY))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    nf.load(sys.argv[1])
    error = None
except Exception as exc:
    error = f"{type(exc).__name__}: {exc}"
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"error": error, "rise_kib": after - before}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="peak RSS from getrusage in KiB, /proc/self/statm: Linux")
@pytest.mark.parametrize("features", [10**8, 10**9])
def test_a_huge_batchnorm_is_refused_before_the_peak_rss_grows(tmp_path, features):
    pytest.importorskip("neuroflow_ops_vision")
    probe = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path / "bn.safetensors"), str(features)],
                           capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(probe.stdout.splitlines()[-1])
    assert result["error"] is not None and result["error"].startswith("CheckpointError: ")
    assert f"op model.0 (BatchNorm2d) asks for {4 * features:,} bytes (a numpy array)" in result["error"]
    assert result["rise_kib"] < 100 * 1024  # was 765 MiB for 10**8 (np.ones of weight and running_var)


_OUTLIVE = """
import numpy as np
from neuroflow.checkpoint.numpy_allocations import AVAILABLE, charged_to

try:
    from numpy._core.multiarray import get_handler_name
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import get_handler_name
with charged_to(lambda nbytes: True):
    kept = [np.ones(10**5), np.zeros(10**5), np.arange(10**5)]
kept[1].resize(10**6, refcheck=False)  # a realloc through the block's handler, after the block
print(AVAILABLE, {get_handler_name(a) for a in kept}, get_handler_name(np.ones(3)))
# the arrays are freed as the interpreter shuts down: by numpy's own free, without calling back into Python
"""


def test_arrays_made_in_a_charged_block_outlive_it_and_the_interpreter():
    probe = subprocess.run([sys.executable, "-c", _OUTLIVE], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0 and probe.stderr == ""
    assert probe.stdout.split() == ["True", "{'neuroflow_charged'}", "default_allocator"]
