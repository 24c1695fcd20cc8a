"""benchmarks/cnn.py runs end to end and prints its table; timings are never asserted."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAS_TORCH = importlib.util.find_spec("torch") is not None


def test_cnn_benchmark_quick(tmp_path: pathlib.Path) -> None:
    report = tmp_path / "cnn.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "cnn.py"), "--quick", "--threads", "1", "--rounds", "1",
         "--steps", "1", "--warmup", "0", "--pause", "0", "--json", str(report)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    names = ["NeuroFlow", "NeuroFlow, update in backward"] + (["PyTorch"] if HAS_TORCH else [])
    assert data["contenders"] == names
    workers = data["results"][0]["workers"]
    first = [workers[n]["first_losses"][0] for n in names]
    assert max(first) - min(first) < 1e-3  # same weights, same batch, same model
    assert "| threads |" in done.stdout
