#!/usr/bin/env bash
# GPU acceptance check for neuroflow-cuda (make gpu-check). Needs: an NVIDIA GPU, Python 3.12 with CuPy,
# PyTorch (CUDA) and pytest preinstalled; no package registry is used. Installs the distributions
# without dependencies, runs the CUDA tests (every core and vision op's backend parity against cpu, the
# fused kernels, zero steady-state device allocations, offload round trips) and benchmarks/gpu.py, each
# under a time limit so the whole check ends within 8 minutes. Results go to gpu-check-results/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${GPU_CHECK_RESULTS:-gpu-check-results}
mkdir -p "$OUT"
status=0

{
  echo "date: $(date -u +%FT%TZ)"; echo "commit: $(git describe --always --dirty 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: not found"
  "$PY" -c 'import sys, cupy, torch; print("python", sys.version.split()[0], "cupy", cupy.__version__, "torch", torch.__version__, "torch cuda", torch.cuda.is_available())' 2>&1
} | tee "$OUT/environment.txt"

# --no-build-isolation: setuptools comes from the interpreter, nothing is fetched.
if ! "$PY" -m pip install -q --no-deps --no-build-isolation -e neuroflow-core -e neuroflow-ops-vision \
      -e neuroflow-ops-recurrent -e neuroflow-cuda >"$OUT/install.log" 2>&1; then
  echo "install failed; see $OUT/install.log"; tail -20 "$OUT/install.log"; exit 1
fi
if ! "$PY" -c 'import neuroflow_cuda, sys; r = neuroflow_cuda.unavailable_reason(); print(r or "cuda backend available"); sys.exit(r is not None)' \
      | tee "$OUT/backend.txt"; then
  echo "the cuda backend cannot run here; nothing else to check"; exit 1
fi
NEUROFLOW_BACKEND= timeout 30 "$PY" -c "from neuroflow.cli.main import main; main(['doctor'])" >"$OUT/doctor.txt" 2>&1 || true

# Every OpTestCase in the core, vision and recurrent suites runs test_backend_parity once per runnable
# backend, cuda included; tests/cuda holds the kernel, memory and offload checks.
timeout 300 "$PY" -m pytest -q -p no:cacheprovider -rs --junitxml="$OUT/pytest.xml" \
    tests/cuda tests/core/test_ops.py tests/core/test_lora.py tests/vision tests/recurrent/test_gradcheck.py \
    -k "cuda or parity" -m "not slow and not convergence" 2>&1 | tee "$OUT/pytest.txt"
test_status=${PIPESTATUS[0]}
[ "$test_status" -eq 0 ] || status=1
tail -3 "$OUT/pytest.txt" >"$OUT/pytest-summary.txt"

timeout 150 "$PY" benchmarks/gpu.py --rounds 5 --steps 10 --warmup 5 --json "$OUT/gpu-benchmark.json" \
    2>&1 | tee "$OUT/gpu-benchmark.txt"
bench_status=${PIPESTATUS[0]}
[ "$bench_status" -eq 0 ] || status=1

echo "pytest exit $test_status, benchmark exit $bench_status; results in $OUT/" | tee "$OUT/summary.txt"
exit $status
