"""The benchmarks run end to end and print their tables in the documented shape; timings are never asserted."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAS_TORCH = importlib.util.find_spec("torch") is not None
BENCHMARKS = ROOT / "benchmarks"
RATIO_HEADERS = ["contender", "median ms", "ratio to PyTorch", "per-repeat ratio", "spread"]


def markdown_tables(text: str) -> list[list[list[str]]]:
    """Every markdown table in ``text`` as rows of cells, the header first and the rule line dropped."""
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if not all(set(cell) <= set("-:") for cell in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def check_ratio_table(table: list[list[str]], keys: list[str], expected: dict[str, str | None]) -> None:
    """The ratio table has a row per contender with a positive median, and a ratio exactly where it has a reference."""
    assert table[0] == [*keys, *RATIO_HEADERS]
    rows = {row[len(keys)]: row[len(keys) + 1:] for row in table[1:]}
    assert list(rows) == list(expected)
    for name, (median, ratio, paired, spread) in rows.items():
        assert float(median) > 0 and spread.endswith("%")
        if expected[name] is None:
            assert ratio == paired == "—"
        else:
            assert ratio.endswith("×") and float(ratio[:-1]) > 0 and float(paired[:-1]) > 0


def json_line(stdout: str) -> dict:
    """The summary every benchmark prints as its last line."""
    return json.loads(stdout.strip().splitlines()[-1])


def test_mlp_benchmark_reports_sgd_and_adam_in_one_process(tmp_path):
    report_file = tmp_path / "mlp.json"
    done = _run("mlp.py", "--quick", "--batches", "16", "--threads", "1", "--repeats", "2", "--steps", "2",
                "--warmup", "1", "--separate-processes", "--json", str(report_file))
    frameworks = ["NeuroFlow", "PyTorch", "numpy"] if HAS_TORCH else ["NeuroFlow", "numpy"]
    names = [f"{f} {o}" for o in ("SGD", "Adam") for f in frameworks]
    expected = {n: (None if n.startswith("PyTorch") or not HAS_TORCH else "PyTorch " + n.split()[1]) for n in names}
    one_process, separate, memory = markdown_tables(done.stdout)
    for table in (one_process, separate):
        check_ratio_table(table, ["batch", "threads"], expected)
        assert {tuple(row[:2]) for row in table[1:]} == {("16", "1")}
    assert memory[0][:6] == ["batch", "threads", "contender", "RSS after setup MB", "first step rise MB",
                             "later steps rise MB"]
    assert [row[2] for row in memory[1:]] == names

    summary = json_line(done.stdout)
    assert summary["benchmark"] == "mlp"
    assert list(summary["results"][0]["median_ms"]) == names
    assert set(summary["results"][0]["ratio_to_pytorch"]) == {n for n, ref in expected.items() if ref}

    report = json.loads(report_file.read_text())
    assert report["settings"]["contenders"] == names
    (result,) = report["results"]
    assert {name: len(s) for name, s in result["samples_s"].items()} == {name: 2 for name in names}
    assert result["thread_report"]["openblas"] in (1, None)
    # Contenders with one update start from the same weights on the same batch, so their first losses agree.
    for update in ("SGD", "Adam"):
        first = [losses[0] for name, losses in result["first_losses"].items() if name.endswith(update)]
        assert max(first) - min(first) < 1e-3


def test_mlp_benchmark_times_neuroflow_without_replay_beside_it():
    done = _run("mlp.py", "--quick", "--batches", "16", "--threads", "1", "--repeats", "2", "--steps", "2",
                "--warmup", "3", "--optimizers", "sgd", "--without-replay")
    summary = json_line(done.stdout)
    names = ["NeuroFlow SGD", "NeuroFlow without replay SGD", *(["PyTorch SGD"] if HAS_TORCH else []), "numpy SGD"]
    assert list(summary["results"][0]["median_ms"]) == names


def test_cnn_benchmark_times_the_spec_model_as_written_in_one_process(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import cnn
    import neuroflow as nf
    from neuroflow import ops

    # The main contender is the spec's snippet exactly: no layout argument anywhere.
    spec = nf.Sequential(ops.Conv2d(3, 32, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
                         ops.Conv2d(32, 64, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
                         ops.Flatten(), ops.Linear(4096, 10))
    configs = [(type(layer).__name__, layer.get_config()) for layer in spec.layers]
    assert [(type(layer).__name__, layer.get_config()) for layer in cnn.build_neuroflow().layers] == configs
    assert cnn.CASE.batch == 64

    report_file = tmp_path / "cnn.json"
    done = _run("cnn.py", "--quick", "--threads", "2", "--repeats", "2", "--steps", "1", "--warmup", "0",
                "--separate-processes", "--json", str(report_file))
    names = ["NeuroFlow", "NeuroFlow, NHWC hints", *(["PyTorch"] if HAS_TORCH else [])]
    expected = {n: ("PyTorch" if HAS_TORCH and n != "PyTorch" else None) for n in names}
    one_process, separate = markdown_tables(done.stdout)
    check_ratio_table(one_process, ["threads"], expected)
    assert separate[0][0] == "threads" and [row[0] for row in separate[1:]] == ["2"]
    assert json_line(done.stdout)["benchmark"] == "cnn"
    (result,) = json.loads(report_file.read_text())["results"]
    assert result["thread_report"]["openblas"] in (2, None)
    if HAS_TORCH:
        assert result["thread_report"]["torch"] == 2
    first = [losses[0] for losses in result["first_losses"].values()]
    assert max(first) - min(first) < 1e-3


def test_resnet18_benchmark_times_the_registry_model_in_one_process(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import resnet18
    from neuroflow import registry

    # The main contender is the registry's model called without any layout argument.
    assert resnet18.build_neuroflow().get_config() == registry.models.get("resnet18")(num_classes=10).get_config()

    done = _run("resnet18.py", "--quick", "--repeats", "1", "--steps", "1", "--warmup", "0")
    names = ["NeuroFlow", *(["PyTorch"] if HAS_TORCH else [])]
    (table,) = markdown_tables(done.stdout)
    check_ratio_table(table, ["threads"], {n: ("PyTorch" if HAS_TORCH and n != "PyTorch" else None) for n in names})
    summary = json_line(done.stdout)
    assert summary["benchmark"] == "resnet18" and list(summary["results"][0]["median_ms"]) == names


def test_detector_benchmark_times_training_and_inference_in_one_process():
    done = _run("detector.py", "--quick", "--repeats", "1", "--steps", "1", "--warmup", "0", "--separate-processes",
                "--warm-process")
    numba = ["NeuroFlow, numpy only"] if importlib.util.find_spec("numba") is not None else []
    names = ["NeuroFlow", *numba, *(["PyTorch"] if HAS_TORCH else [])]
    ratios, throughput, frames, rss = markdown_tables(done.stdout)
    whats = ["train step, batch 16", "inference, batch 1", "inference, batch 16"]
    assert [(row[0], row[2]) for row in ratios[1:]] == [(what, name) for what in whats for name in names]
    for what in whats:
        group = [ratios[0]] + [row for row in ratios[1:] if row[0] == what]
        check_ratio_table([row[1:] for row in group], ["threads"],
                          {n: ("PyTorch" if HAS_TORCH and n != "PyTorch" else None) for n in names})
    assert [row[0] for row in throughput[1:]] == whats
    assert all(float(cell) > 0 for row in throughput[1:] for cell in row[2:2 + len(names)])
    assert frames[0][:2] == ["threads", "fps"] and frames[1][:2] == ["2", "30"]
    assert frames[0][2:2 + len(names)] == [f"{n} median ms" for n in names]
    assert all(float(cell) > 0 for cell in frames[1][2:2 + 2 * len(names)])
    assert rss[0][:2] == ["threads", "NeuroFlow ms"] and f"{names[-1]} RSS rise MB" in rss[0]
    for name in names:  # the whole process's peak holds its setup (interpreter, code) and the rise
        rise, peak = (float(rss[1][rss[0].index(f"{name} {what} MB")]) for what in ("RSS rise", "process peak"))
        assert peak > rise + 20
    summary = json_line(done.stdout)
    assert summary["benchmark"] == "detector" and [r["what"] for r in summary["results"]] == whats
    assert set(summary["rss_rise_kb"][0]) == set(names) and set(summary["frames_median_ms"][0]) == set(names)


def test_detector_benchmark_times_frames_alone_and_refuses_a_bad_rate():
    done = _run("detector.py", "--quick", "--repeats", "1", "--warmup", "0", "--measurements", "frames", "--fps", "50",
                "--frames-per-block", "2")
    (frames,) = markdown_tables(done.stdout)
    assert frames[1][:2] == ["2", "50"]
    assert json_line(done.stdout)["results"] == []
    refused = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "detector.py"), "--fps", "0"],
                             capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2 and "--fps must be above 0" in refused.stderr


def test_detector_benchmark_keeps_the_maps_when_asked():
    """--keep-maps runs the same contenders (whose first losses the run checks against each other)."""
    args = ("--quick", "--repeats", "1", "--steps", "1", "--warmup", "0", "--measurements", "train")
    kept, let_go = (json_line(_run("detector.py", *args, *extra).stdout) for extra in (("--keep-maps",), ()))
    assert list(kept["results"][0]["median_ms"]) == list(let_go["results"][0]["median_ms"])


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return done


def test_compression_benchmark_quick_reports_every_mode():
    tables = markdown_tables(_run("compression.py", "--quick", "--steps", "20").stdout)
    modes = {row[0] for table in tables for row in table[1:]}
    assert {"dense", "topk 10 %", "threshold 5e-3", "auto 10 %"} <= modes


def test_backends_benchmark_quick_compares_opencl_with_cpu(tmp_path):
    pytest.importorskip("pyopencl")
    pytest.importorskip("neuroflow_opencl")
    from neuroflow.backends import qualification
    from neuroflow_opencl import OpenclBackend

    # the devices the benchmark must show: every qualified one (its verdicts are cached, so the run agrees)
    qualified = [v for _, v in qualification.offered("opencl") if v.ok] if OpenclBackend.device_count() else []
    report_file = tmp_path / "backends.json"
    out = _run("backends.py", "--quick", "--rounds", "1", "--steps", "2", "--warmup", "1",
               "--json", str(report_file)).stdout
    if not qualified:  # it says why and measures nothing
        assert out.strip() and not markdown_tables(out) and not report_file.exists()
        pytest.skip("no OpenCL device qualified here")
    names = [f"opencl:{i}" for i in range(len(qualified))]
    devices, timing = markdown_tables(out)

    assert devices[0] == ["contender", "device", "driver (platform version)", "vector bytes"]
    assert [row[0] for row in devices[1:]] == names
    for row, verdict in zip(devices[1:], qualified, strict=True):
        assert row[1] == verdict.identity["device"]
        assert row[2] == " ".join(verdict.identity["platform version"].split())
        assert int(row[3]) > 0

    # a column per qualified device, labelled with its driver; then each one's ratios to cpu
    header = timing[0]
    assert header[:2] == ["what", "cpu / numpy"] and header[-1] == "spread"
    labels = header[2:2 + len(names)]
    assert [label.split(" (")[0] for label in labels] == names
    assert all(label.endswith(")") and len(label) > len(name) + 3 for label, name in zip(labels, names, strict=True))
    assert header[2 + len(names):-1] == [f"{n}/cpu time" for n in names] + [f"{n} paired" for n in names]
    rows = {row[0]: row for row in timing[1:]}
    assert "MLP train step (ms)" in rows and "CNN train step (ms)" in rows
    for row in rows.values():
        assert all(float(cell) > 0 for cell in row[1:2 + len(names)])
        assert all(cell.endswith("×") and float(cell[:-1]) > 0 for cell in row[2 + len(names):-1])

    report = json.loads(report_file.read_text())
    assert report["settings"]["contenders"] == ["cpu", *names]
    for result in report["results"]:
        assert set(result["samples_s"]) == {"cpu", *names}
        assert set(result["paired_ratio"]) == set(names)


def test_gpu_benchmark_says_why_it_skips_without_a_gpu():
    from neuroflow import registry

    if registry.backends.get("cuda").is_available():
        pytest.skip("a GPU machine runs the real benchmark through make gpu-check")
    assert "needs an NVIDIA GPU" in _run("gpu.py").stdout


def _harness():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import harness
    finally:
        sys.path.remove(str(BENCHMARKS))
    return harness


def test_a_timed_block_starts_after_its_settling_steps(monkeypatch):
    """``time_block`` runs ``settle`` untimed steps, then times ``steps`` (the slow first step is not in the time)."""
    harness = _harness()
    clock = iter(range(100, 200))
    calls: list[str] = []
    monkeypatch.setattr(harness.time, "perf_counter", lambda: float(next(clock)))

    def step() -> None:
        calls.append("step")
        next(clock)  # one tick a step

    assert harness.time_block(step, steps=4, settle=2) == pytest.approx((4 + 1) / 4)
    assert len(calls) == 6


def test_workers_settle_before_a_block_and_a_negative_settle_is_refused():
    harness = _harness()
    worker = harness.Worker(["-c", "import sys, json; sys.path.insert(0, sys.argv[1]); import harness; n = []; "
                                   "print(json.dumps({}), flush=True); harness.serve_blocks(lambda: n.append(1)); "
                                   "print('steps', len(n), flush=True)", str(BENCHMARKS)])
    try:
        assert worker.run(3, settle=2) >= 0 and worker.run(1, settle=0) >= 0 and worker.run(2) >= 0
    finally:
        worker.close()
    assert worker.process.stdout.read().split() == ["steps", str(3 + 2 + 1 + 2 + harness.SETTLE_STEPS)]
    refused = subprocess.run([sys.executable, str(BENCHMARKS / "cnn.py"), "--settle", "-1"], capture_output=True,
                             text=True, timeout=60, check=False)
    assert refused.returncode == 2 and "--settle" in refused.stderr
