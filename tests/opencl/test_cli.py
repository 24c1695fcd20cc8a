"""`neuroflow doctor` and `neuroflow backends` show the opencl backend and its device."""

from __future__ import annotations

from typing import Any

import pytest

from neuroflow.cli import main


def opencl_line(out: str, device: str | None = None) -> str:
    """The row of the opencl backend ("opencl" or "opencl:0" in its first column), or of ``device``."""
    return next(line for line in out.splitlines() if line.split()[:1] and (
        line.split()[0] == device if device else line.split()[0].split(":")[0] == "opencl"))


def test_backends_lists_opencl_as_available(backend: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["backends"]) == 0
    line = opencl_line(capsys.readouterr().out)
    assert "neuroflow-opencl" in line and "ok" in line and "available" in line and "not available" not in line


def test_doctor_lists_the_opencl_device(backend: Any, capsys: pytest.CaptureFixture[str]) -> None:
    facts = backend.cl_device.facts
    assert main(["doctor"]) == 0
    line = opencl_line(capsys.readouterr().out, backend.device)
    assert "qualified (" in line and f"device={facts.name}" in line and f"platform={facts.platform}" in line
    assert f"vectors={backend.cl_device.vector_bytes} bytes" in line
    assert f"fp64={'yes' if facts.fp64 else 'no'}" in line and f"compute_units={facts.compute_units}" in line


def test_doctor_without_a_driver_says_what_to_install(backend: Any, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import neuroflow_opencl.backend

    monkeypatch.setattr(neuroflow_opencl.backend, "all_devices", lambda: ())
    assert main(["doctor"]) == 0
    line = opencl_line(capsys.readouterr().out)
    assert "not available here" in line and "pip install 'neuroflow-opencl[pocl]'" in line
