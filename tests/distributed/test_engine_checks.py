"""What keeps the ranks in step: debug=True's parameter check, an error on one rank, a stop asked on one rank."""

from __future__ import annotations

import re


def test_debug_ends_the_run_when_the_ranks_parameters_differ(launch):
    result = launch(2, "worker_faults.py", "diverge", check=False)
    assert result.returncode != 0
    assert "ParametersDivergedError: after step 2 the parameters differ between ranks" in result.stderr
    assert "finished" not in result.stdout


def test_an_error_on_one_rank_ends_every_rank_instead_of_leaving_them_in_a_collective(launch):
    result = launch(2, "worker_faults.py", "raise", check=False)  # within the timeout: no rank is left waiting
    assert result.returncode != 0
    assert "rank 1 of 2 aborts the run: NonFiniteDataError" in result.stderr
    assert "finished" not in result.stdout


def test_a_stop_asked_on_one_rank_stops_every_rank_after_the_same_step(launch):
    result = launch(2, "worker_faults.py", "stop")
    stops = sorted(re.findall(r"rank \d stopped after step \d+, interrupted=\w+", result.stdout))  # ranks' lines may interleave
    assert stops == ["rank 0 stopped after step 4, interrupted=True", "rank 1 stopped after step 4, interrupted=True"]
