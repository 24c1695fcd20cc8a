"""Property-based stress: random batch, time, feature and hidden sizes against the naive float64 reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuroflow import ops

from .reference import check_op


@st.composite
def configurations(draw: st.DrawFn) -> dict:
    kind = draw(st.sampled_from(["elman-tanh", "elman-relu", "gru", "lstm"]))
    time = draw(st.integers(1, 9))
    return {
        "kind": kind,
        "batch": draw(st.integers(1, 4)),
        "time": time,
        "features": draw(st.integers(1, 4)),
        "hidden": draw(st.integers(1, 5)),
        "return_sequences": draw(st.booleans()),
        "bptt_steps": draw(st.one_of(st.none(), st.integers(1, time + 1))),
        "with_state": draw(st.booleans()),
        "bias": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


@settings(max_examples=60, deadline=None)
@given(configurations())
def test_random_shapes_match_the_reference(config: dict) -> None:
    kind, hidden = config["kind"], config["hidden"]
    options = {"return_sequences": config["return_sequences"], "bptt_steps": config["bptt_steps"],
               "bias": config["bias"], "stateful": config["with_state"]}
    if kind.startswith("elman"):
        op = ops.Elman(config["features"], hidden, nonlinearity=kind.split("-")[1], **options)
    else:
        op = (ops.GRU if kind == "gru" else ops.LSTM)(config["features"], hidden, **options)
    rng = np.random.default_rng(config["seed"])
    x = rng.standard_normal((config["batch"], config["time"], config["features"]))
    state = None
    if config["with_state"]:
        state = rng.standard_normal((config["batch"], hidden))
        if kind == "lstm":
            state = (state, rng.standard_normal((config["batch"], hidden)))
    check_op(op, x, state=state, seed=config["seed"])


@settings(max_examples=25, deadline=None)
@given(
    levels=st.integers(1, 3),
    blocks=st.integers(1, 3),
    batch=st.integers(1, 3),
    features=st.integers(1, 3),
    hidden=st.integers(1, 4),
    nonlinearity=st.sampled_from(["tanh", "relu", "morlet", "mexican_hat"]),
    return_sequences=st.booleans(),
    bptt_steps=st.one_of(st.none(), st.integers(1, 8)),
    seed=st.integers(0, 2**16),
)
def test_wavelet_elman_random_windows_match_the_reference(levels: int, blocks: int, batch: int, features: int,
                                                          hidden: int, nonlinearity: str, return_sequences: bool,
                                                          bptt_steps: int | None, seed: int) -> None:
    pytest.importorskip("pywt")
    op = ops.WaveletElman(features, hidden, levels=levels, nonlinearity=nonlinearity,
                          return_sequences=return_sequences, bptt_steps=bptt_steps)
    x = np.random.default_rng(seed).standard_normal((batch, blocks * 2**levels, features))
    check_op(op, x, seed=seed)
