"""One op instance in two places of a Sequential would train wrongly (its second forward overwrites the state the
first one's backward reads: measured, a shared ReLU gave losses 0.69/0.65/0.63 where two gave 0.65/0.59/0.52), so the
chain refuses it when built, naming both places and what to write instead."""

from __future__ import annotations

import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.errors import ConfigError


def test_an_activation_reused_in_a_sequential_is_refused_with_the_places_named():
    relu = ops.ReLU()
    with pytest.raises(ConfigError, match=r"items 1 and 3 are the same ReLU\(\).*create a ReLU for each"):
        nf.Sequential(ops.Linear(8, 8), relu, ops.Linear(8, 8), relu, ops.Linear(8, 2))


def test_a_layer_reused_for_tied_weights_is_refused():
    linear = ops.Linear(8, 8)
    with pytest.raises(ConfigError, match="items 0 and 2"):
        nf.Sequential([linear, ops.ReLU(), linear])


def test_equal_but_distinct_instances_are_fine():
    model = nf.Sequential(ops.Linear(8, 8), ops.ReLU(), ops.Linear(8, 8), ops.ReLU())
    assert len(model) == 4
