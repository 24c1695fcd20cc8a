"""N ranks × global batch B train as one process with batch B, under real ``mpiexec`` runs (OMP_NUM_THREADS=1)."""

from __future__ import annotations

import re

import numpy as np
import pytest

STEPS = "50"


def train(launch, tmp_path, ranks, *args):
    out = tmp_path / f"run-{ranks}.npz"
    launch(ranks, "worker_train.py", str(out), "--steps", STEPS, *args,
           *(("--distributed", "none") if ranks is None else ("--debug",)))
    return dict(np.load(out))


def relative(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("args", [
    ("--optimizer", "sgd"),
    ("--optimizer", "adamw"),
    ("--optimizer", "sgd", "--accumulation", "3"),
    ("--optimizer", "adamw", "--accumulation", "2", "--clip", "0.5"),
    ("--model", "cnn", "--optimizer", "adamw", "--batch", "7", "--bucket-mb", "0.001"),
    ("--optimizer", "sgd", "--topk", "1.0"),
], ids=["mlp-sgd", "mlp-adamw", "mlp-sgd-accumulation", "mlp-adamw-accumulation-clip", "cnn-adamw-small-buckets",
        "mlp-compression-keeping-everything"])
def test_two_ranks_train_as_one_process_with_the_global_batch(launch, tmp_path, args):
    one = train(launch, tmp_path, None, *args)
    two = train(launch, tmp_path, 2, *args)
    assert int(two["size"]) == 2 and int(two["steps"]) == int(one["steps"]) == 50
    assert relative(two["params"], one["params"]) <= 1e-5
    # the History's losses and evaluate's sums are those of the global batches, from every rank's rows
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-9)
    assert two["eval_loss"] == pytest.approx(float(one["eval_loss"]), rel=1e-9)
    assert float(two["eval_accuracy"]) == float(one["eval_accuracy"])
    # debug=True checked after every step that the ranks' parameters are bit-identical; and at the end:
    assert two["checksum_max"] == two["checksum_min"]


def test_float32_cnn_stays_within_rounding_of_one_process(launch, tmp_path):
    args = ("--model", "cnn", "--dtype", "float32", "--optimizer", "adamw")
    one, two = train(launch, tmp_path, None, *args), train(launch, tmp_path, 2, *args)
    assert relative(two["params"], one["params"]) <= 1e-5
    assert two["checksum_max"] == two["checksum_min"]


def test_one_rank_under_mpiexec_is_one_process_bit_for_bit(launch, tmp_path):
    one = train(launch, tmp_path, None, "--optimizer", "adamw", "--accumulation", "2")
    mpi = train(launch, tmp_path, 1, "--optimizer", "adamw", "--accumulation", "2")
    assert int(mpi["size"]) == 1
    np.testing.assert_array_equal(mpi["params"], one["params"])


def test_batchnorm_statistics_stay_per_rank_unless_synchronised(launch, tmp_path):
    apart = train(launch, tmp_path, 2, "--model", "cnnbn", "--steps", "5")
    one = train(launch, tmp_path, None, "--model", "cnnbn", "--steps", "5")
    assert apart["checksum_max"] == apart["checksum_min"]  # the parameters agree across ranks either way
    assert apart["buffers_max"] != apart["buffers_min"]  # each rank's running statistics are its own rows'
    assert relative(apart["params"], one["params"]) > 1e-3  # and the training is not one process's


@pytest.mark.parametrize("args", [
    ("--optimizer", "sgd"),
    ("--optimizer", "adamw", "--accumulation", "3"),
], ids=["sgd", "adamw-accumulation"])
@pytest.mark.parametrize("model", ["cnnbn", "nfcnn"])  # NCHW BatchNorm; the registry's CNN: NHWC, fused ReLU, SE
def test_synchronised_batchnorm_trains_as_one_process_with_the_global_batch(launch, tmp_path, model, args):
    one = train(launch, tmp_path, None, "--model", model, *args)
    two = train(launch, tmp_path, 2, "--model", model, "--sync-bn", *args)
    assert int(two["steps"]) == int(one["steps"]) == 50
    assert relative(two["params"], one["params"]) <= 1e-5
    assert relative(two["buffers"], one["buffers"]) <= 1e-5  # running statistics of the global batches
    assert two["buffers_max"] == two["buffers_min"]  # and the same on every rank
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-7)
    assert two["checksum_max"] == two["checksum_min"]


def test_compressed_gradients_are_summed_and_every_rank_applies_the_same_update(launch, tmp_path):
    start = train(launch, tmp_path, None, "--steps", "1", "--topk", "0.1")
    two = train(launch, tmp_path, 2, "--topk", "0.1")  # each rank's own top 10 % (and residual), summed dense
    assert two["checksum_max"] == two["checksum_min"]
    assert float(two["loss"][-1]) < float(start["loss"][0])


def test_a_sparse_gradient_is_summed_from_its_nonzero_entries_to_the_dense_sum_s_bits(launch):
    result = launch(2, "worker_sparse.py")
    found = sorted(re.findall(r"rank \d density [\d.]+: sparse=(?:True|False) equal=(?:True|False)", result.stdout))  # lines may interleave
    assert found == [f"rank {rank} density {density}: sparse={sparse} equal=True"
                     for rank in (0, 1) for density, sparse in (("0.01", True), ("0.1", True), ("0.9", False))]
