"""Driver checks for `neuroflow doctor`: the warnings a user gets for a driver too old for the card or CuPy."""

from __future__ import annotations

import pytest

from neuroflow_cuda import probe


def test_versions_print_as_nvidia_smi_does() -> None:
    assert probe.cuda_version_text(12040) == "12.4"
    assert probe.cuda_version_text(11080) == "11.8"


def test_a_matching_driver_gives_no_warning() -> None:
    assert probe.driver_warnings(12040, 12040, (8, 6)) == []


def test_a_driver_too_old_for_the_architecture_is_named() -> None:
    warnings = probe.driver_warnings(11070, 11070, (9, 0))  # Hopper needs CUDA 11.8
    assert len(warnings) == 1
    assert "CUDA 11.7, older than the 11.8 compute capability 9.0 needs" in warnings[0]


def test_a_driver_of_an_older_major_than_cupy_says_which_wheel_to_install() -> None:
    warnings = probe.driver_warnings(11080, 12020, (8, 0))
    assert any("install the CuPy wheel for CUDA 11" in w for w in warnings)


def test_a_driver_older_than_the_runtime_minor_warns_about_compiled_kernels() -> None:
    warnings = probe.driver_warnings(12020, 12090, (8, 9))
    assert warnings == [w for w in warnings if "runtime-compiled kernels may fail to load" in w] and warnings


def test_an_architecture_newer_than_the_table_is_flagged_not_crashed_on() -> None:
    warnings = probe.driver_warnings(13000, 13000, (15, 0))
    assert any("newer than this check knows" in w for w in warnings)


@pytest.mark.parametrize("index,count", [(-1, 1), (1, 1), (0, 0)])
def test_indices_outside_the_devices_are_refused(index: int, count: int) -> None:
    with pytest.raises(Exception, match="was asked for"):
        probe.check_index(index, count)
