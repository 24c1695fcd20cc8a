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
CONTENDERS = ["NeuroFlow", "PyTorch", "numpy"] if HAS_TORCH else ["NeuroFlow", "numpy"]


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


def test_mlp_benchmark_quick_prints_its_tables(tmp_path):
    report_file = tmp_path / "mlp.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "mlp.py"), "--quick", "--batches", "16", "--threads", "1",
         "--rounds", "2", "--steps", "2", "--warmup", "1", "--pause", "0", "--json", str(report_file)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    timing, cross_check, memory = markdown_tables(done.stdout)

    ratios = ["NeuroFlow/PyTorch", "numpy/PyTorch"] if HAS_TORCH else []
    assert timing[0] == ["batch", "threads", *(f"{c} ms" for c in CONTENDERS), *ratios, "NeuroFlow/numpy", "spread"]
    assert [row[:2] for row in timing[1:]] == [["16", "1"]]
    for row in timing[1:]:
        assert all(float(ms) > 0 for ms in row[2:2 + len(CONTENDERS)])
        assert all(cell.endswith("×") and float(cell[:-1]) > 0 for cell in row[2 + len(CONTENDERS):-1])

    assert [row[:2] for row in cross_check[1:]] == [["16", "1"]]

    assert memory[0][:6] == ["batch", "threads", "contender", "RSS after setup MB", "first step rise MB",
                             "later steps rise MB"]
    assert len(memory[0]) == (7 if HAS_TORCH else 6)
    assert [row[:3] for row in memory[1:]] == [["16", "1", c] for c in CONTENDERS]

    report = json.loads(report_file.read_text())
    assert report["settings"]["contenders"] == CONTENDERS
    for result in report["results"]:
        assert {name: len(s) for name, s in result["samples_s"].items()} == {name: 2 for name in CONTENDERS}
        # The workers start from the same weights on the same batch, so their first losses agree.
        first = [w["first_losses"][0] for w in result["workers"].values()]
        assert max(first) - min(first) < 1e-3


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
