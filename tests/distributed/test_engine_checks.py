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
    # the rows are named in the global batch of 8, whose rows 4..7 are rank 1's: not counted from rank 1's first
    named = re.search(r"in sample\(s\) ([\d, ]+) of the global batch \(rank 1 of 2 holds them\)", result.stderr)
    assert named is not None, result.stderr[-2000:]
    assert all(4 <= int(row) < 8 for row in named.group(1).split(", "))


def test_a_stop_asked_on_one_rank_stops_every_rank_after_the_same_step(launch):
    result = launch(2, "worker_faults.py", "stop")
    stops = sorted(re.findall(r"rank \d stopped after step \d+, interrupted=(?:True|False)", result.stdout))  # ranks' lines may interleave
    assert stops == ["rank 0 stopped after step 4, interrupted=True", "rank 1 stopped after step 4, interrupted=True"]


def test_evaluate_on_one_rank_while_the_other_trains_ends_the_run_naming_evaluate(launch):
    result = launch(2, "worker_faults.py", "evaluate_alone", check=False)  # at once, not at the collective timeout
    assert result.returncode != 0
    assert "CollectiveMismatchError" in result.stderr and "in a different collective" in result.stderr
    assert "Trainer.evaluate sums over every rank: call it on every rank" in result.stderr
    assert "finished" not in result.stdout


def test_predict_on_one_rank_needs_no_other_rank(launch):
    result = launch(2, "worker_faults.py", "predict_alone")
    assert "rank 0 predicted (64, 3)" in result.stdout
    assert "rank 0 finished" in result.stdout and "rank 1 finished" in result.stdout


def test_evaluate_on_one_rank_after_the_others_finished_ends_the_run_long_before_the_timeout(launch, tmp_path):
    result = launch(2, "worker_faults.py", "evaluate_after", check=False,  # the timeout is 300 s; the test's is 120
                    env={"NEUROFLOW_RUN_DIR": str(tmp_path / "run")})
    assert result.returncode != 0
    assert ("rank 0 is in an allreduce of the sums of Trainer.evaluate, which no other rank will join: every other "
            "rank has finished") in result.stderr
