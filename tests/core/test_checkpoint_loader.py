"""The loader: files read whole or mapped, checksums by several threads, parameters viewing the file's bytes."""
import os
import socket
import threading

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops, registry
from neuroflow.checkpoint import CheckpointError, reading
from neuroflow.operator import Operator
from neuroflow.tensor import Tensor


def test_a_large_model_loads_exactly_through_parallel_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(reading, "BYTES_PER_THREAD", 1)  # as many threads as cores, even for a small file
    monkeypatch.setattr(reading.os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(300, 200), ops.ReLU(), ops.Linear(200, 100), ops.Linear(100, 3))
    nf.save(model, tmp_path / "m.safetensors")
    loaded = nf.load(tmp_path / "m.safetensors")
    assert all(np.array_equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    assert reading.checking_threads(10**9) == 4


@pytest.mark.parametrize("threads", [1, 4])
def test_flipped_bits_in_several_tensors_are_all_named(tmp_path, monkeypatch, threads):
    monkeypatch.setattr(reading, "checking_threads", lambda size: threads)
    nf.manual_seed(0)
    nf.save(nf.Sequential(ops.Linear(300, 200), ops.Linear(200, 100)), tmp_path / "m.safetensors")
    from neuroflow.checkpoint.container import read_header
    header = read_header(tmp_path / "m.safetensors")
    raw = bytearray((tmp_path / "m.safetensors").read_bytes())
    for name in ("0.weight", "1.bias"):
        raw[header.tensors[name].start + 5] ^= 0x10
    (tmp_path / "m.safetensors").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"tensors 0.weight, 1.bias fail their checksums"):
        nf.load(tmp_path / "m.safetensors")


class Odd(Operator):
    """Initialises like plugins might: draws kept as float64 parameters, arithmetic on draws, in-place scaling."""

    def __init__(self, n: int = 400) -> None:
        super().__init__()
        rng = nf.random.generator()
        self.n = n
        self.kept = Tensor(rng.normal(0, 1, (n, n)), requires_grad=True)  # no astype: stays float64
        w = rng.uniform(-1, 1, (n,))
        w *= 3.0
        self.scaled = Tensor((w + 1).astype(np.float64), requires_grad=True)
        self.orth = Tensor(np.linalg.qr(rng.standard_normal((n, n)))[0], requires_grad=True)

    def forward(self, x):
        return x @ self.kept.data + self.scaled.data + x @ self.orth.data

    def get_config(self):
        return {"n": self.n}


def test_unusual_initialisers_load_their_saved_values(tmp_path, monkeypatch):
    monkeypatch.setattr(registry.ops, "names", registry.ops.names)  # keep registry state isolated below
    registry.ops.register("Odd", Odd)
    try:
        nf.manual_seed(0)
        model = Odd()
        nf.save(model, tmp_path / "m.safetensors")
        loaded = nf.load(tmp_path / "m.safetensors")
        for (name, a), (_, b) in zip(model.named_parameters(), loaded.named_parameters()):
            assert type(b.data) is np.ndarray and b.data.flags.writeable, name
            np.testing.assert_array_equal(a.data, b.data)
        loaded.astype(np.float32)  # an ordinary array converts its values, not to zeros
        assert np.array_equal(loaded.kept.data, model.kept.data.astype(np.float32))
    finally:
        registry.ops.unregister("Odd") if hasattr(registry.ops, "unregister") else None


def test_resnet18_loads_bit_exact(tmp_path):
    pytest.importorskip("neuroflow_ops_vision")
    nf.manual_seed(0)
    model = registry.models.get("resnet18")()
    nf.save(model, tmp_path / "r.safetensors")
    loaded = nf.load(tmp_path / "r.safetensors")
    assert all(np.array_equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def _mlp_file(tmp_path, quantize=None):
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(300, 200), ops.ReLU(), ops.Linear(200, 10))
    nf.save(model, tmp_path / "m.safetensors", quantize=quantize)
    return model, tmp_path / "m.safetensors"


@pytest.mark.parametrize("mmap", [False, True])
def test_a_float_model_views_one_buffer_that_it_may_change_without_touching_the_file(tmp_path, mmap):
    model, path = _mlp_file(tmp_path)
    before = path.read_bytes()
    loaded = nf.load(path, mmap=mmap)
    weight = loaded[0].weight.data
    assert weight.base is not None and weight.flags.writeable and weight.flags.aligned  # a view, no copy
    assert all(np.array_equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    weight[...] = 7.0  # copy-on-write: the file keeps its bytes
    assert path.read_bytes() == before
    assert np.array_equal(nf.load(path, mmap=mmap)[0].weight.data, model[0].weight.data)
    trainer = nf.Trainer(loaded, loss=nf.losses.MSE(), batch_size=4, progress=False)
    assert np.isfinite(trainer.train_step(np.ones((4, 300), np.float32), np.zeros((4, 10), np.float32)))


def test_files_are_mapped_unless_told_or_unable(tmp_path, monkeypatch):
    from neuroflow.checkpoint.reading import open_file

    _, path = _mlp_file(tmp_path)
    assert open_file(path)[1].mapped and not open_file(path, mmap=False)[1].mapped

    def cannot_map(*args, **kwargs):
        raise OSError("out of mappings")

    monkeypatch.setattr(reading.mmap_module, "mmap", cannot_map)
    header, content = open_file(path)
    assert not content.mapped and "0.weight" in header.tensors


def test_a_converted_file_leaves_no_view_of_its_bytes(tmp_path):
    model, path = _mlp_file(tmp_path, quantize="int8")
    loaded = nf.load(path, mmap=True)
    for tensor in loaded.parameters():
        assert tensor.data.base is None and tensor.data.dtype == np.float32  # arrays of their own
    np.testing.assert_allclose(loaded[0].weight.data, model[0].weight.data, atol=np.abs(model[0].weight.data).max() / 200)


@pytest.mark.parametrize("mmap", [False, True])
def test_a_flipped_bit_is_refused_whether_read_or_mapped(tmp_path, mmap):
    _, path = _mlp_file(tmp_path)
    from neuroflow.checkpoint.container import read_header

    raw = bytearray(path.read_bytes())
    raw[read_header(path).tensors["2.weight"].start + 11] ^= 0x01
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="tensor 2.weight fails its checksum"):
        nf.load(path, mmap=mmap)


def test_a_forked_child_gets_its_own_checksum_threads(monkeypatch):
    first = reading._pool()
    assert reading._pool() is first
    monkeypatch.setattr(reading.os, "getpid", lambda: -1)  # as in a child made by os.fork
    assert reading._pool() is not first


def test_files_saved_with_either_crc32_load_with_the_other(tmp_path, monkeypatch):
    """ISA-L's CRC-32 (the safetensors extra) and zlib's give the same checksums: files move between installs."""
    import zlib

    from neuroflow.checkpoint import checksums
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    assert isal_zlib.crc32(data.data, 12345) == zlib.crc32(data.data, 12345)
    assert checksums.crc32 is isal_zlib.crc32
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(30, 20), ops.Linear(20, 3))
    for saver, loader in [(isal_zlib.crc32, zlib.crc32), (zlib.crc32, isal_zlib.crc32)]:
        monkeypatch.setattr(checksums, "crc32", saver)
        nf.save(model, tmp_path / "m.safetensors")
        monkeypatch.setattr(checksums, "crc32", loader)
        loaded = nf.load(tmp_path / "m.safetensors")
        assert np.array_equal(loaded[0].weight.data, model[0].weight.data)
    raw = bytearray((tmp_path / "m.safetensors").read_bytes())
    raw[-3] ^= 1
    (tmp_path / "m.safetensors").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="fails its checksum"):
        nf.load(tmp_path / "m.safetensors")  # zlib, the fallback, still catches a flipped bit


# --------------------------------------------------------------------------- regular files only
def _special_files(tmp_path) -> dict[str, tuple[object, str]]:
    """Paths that are no regular file, and the kind each error names; the socket stays bound while used."""
    fifo, sock = tmp_path / "fifo", tmp_path / "sock"
    os.mkfifo(fifo)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    return {"fifo": (fifo, "a FIFO (named pipe)"), "directory": (tmp_path, "a directory"),
            "device": (os.devnull, "a character device"), "socket": (sock, "a socket"), "server": (server, "")}


def _without_hanging(call) -> BaseException | None:
    """What ``call`` raised, run in a thread: a call that blocks fails the test instead of hanging the run."""
    outcome: list[BaseException | None] = []

    def run():
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)
    if worker.is_alive():
        pytest.fail("the call blocked: it opened the FIFO and waits for a writer")
    return outcome[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and unix sockets: POSIX")
@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "socket"])
@pytest.mark.parametrize("reader", ["load", "load read", "header", "state_dict"])
def test_only_regular_files_are_opened(tmp_path, kind, reader):
    special = _special_files(tmp_path)
    path, named = special[kind]
    read = {
        "load": lambda: nf.load(path), "load read": lambda: nf.load(path, mmap=False),
        "header": lambda: nf.checkpoint.open_model_file(path),
        "state_dict": lambda: nf.checkpoint.load_state_dict_file(nf.Sequential(ops.Linear(2, 2)), path),
    }[reader]
    try:
        error = _without_hanging(read)
    finally:
        special["server"][0].close()
    assert isinstance(error, CheckpointError)
    assert f"{path} is {named}, not a regular file; a model file or checkpoint is read from a regular file" in str(error)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs: POSIX")
def test_a_path_replaced_by_a_fifo_after_its_check_is_refused_without_waiting(tmp_path, monkeypatch):
    fifo, regular = tmp_path / "fifo", tmp_path / "m.safetensors"
    os.mkfifo(fifo)
    nf.save(nf.Sequential(ops.Linear(2, 2)), regular)
    real_stat = os.stat
    # The check before opening sees a regular file, as it would if the path were swapped just after it.
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: real_stat(regular if str(p) == str(fifo) else p, *a, **k))
    error = _without_hanging(lambda: nf.load(fifo))
    assert isinstance(error, CheckpointError) and "is a FIFO (named pipe), not a regular file" in str(error)
