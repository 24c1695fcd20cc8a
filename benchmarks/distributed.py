"""Data-parallel training: 1 and 2 ranks at one thread each, NeuroFlow (mpi) vs PyTorch DDP (gloo), side by side.

For the MLP 784-128-64-10, the spec's small CNN and ResNet-18 (CIFAR variant), batch 32 per rank, SGD lr 0.01
momentum 0.9, every run under ``mpiexec`` (the mpich wheel's, or ``NEUROFLOW_MPIEXEC``) with every thread
variable at 1:

- **samples/s** of 1 rank (batch 32) and of 2 ranks (global batch 64), from the median step time;
- **scaling efficiency**: 2-rank samples/s over twice the 1-rank samples/s (1.0: perfect); and **vs 2 alone**,
  the step time of 2 ranks training alone side by side over the data-parallel step's: what the communication
  costs, without what two processes on the machine cost each other (a loaded or memory-bound machine). In the
  2-rank run each rank interleaves blocks of consecutive steps (``STEPS``: 5 for the small CNN): alone,
  data-parallel, (NeuroFlow) data-parallel with every bucket started after backward, and again; load and drift
  on a shared machine hit them alike, and most steps follow a step of the same model, as in training;
- **allreduce**: the time one blocking allreduce of all the gradients takes on 2 ranks; for NeuroFlow the engine's
  own timers (:attr:`neuroflow.trainer.data_parallel.DataParallel.timing`): **exposed**, the communication left
  once every rank had finished backward, with the buckets started during backward and with all of them started
  after it (the whole exchange), and the **waiting for the slower rank** (skew between the ranks, not
  communication); the **share hidden** is 1 - exposed (overlapped) / exposed (after backward). PyTorch has no
  such timers: its share is 1 - (DP step - 2 alone step) / allreduce, marked "(step time)".
  ``--bucket-mb 0.5 2 8`` compares bucket sizes (one 2-rank run each per round).

The 1-rank reference and the 2-rank run are two ``mpiexec`` runs, minutes apart for ResNet-18; one unlucky
reference moved the efficiency by ±0.05 between otherwise equal runs. So every framework's pair of runs is
repeated ``--rounds`` times (default 3) in turn, the first framework rotating, and the table gives the median of
each time over the rounds (per-round rows are printed as they finish, and kept in ``--json``).

PyTorch (``torch==2.13.0``, benchmark-only: ``.venv/bin/pip install torch==2.13.0``) runs the same models
from the same weights as ``torch.nn.parallel.DistributedDataParallel`` over gloo on 127.0.0.1 (its default
25 MiB buckets), started by the same ``mpiexec`` (rank and size from MPI).

    .venv/bin/python benchmarks/distributed.py                    # every model, both frameworks (minutes)
    .venv/bin/python benchmarks/distributed.py --models mlp,cnn --frameworks neuroflow
    .venv/bin/python benchmarks/distributed.py --models resnet18 --frameworks neuroflow --bucket-mb 1 2 4
    .venv/bin/python benchmarks/distributed.py --models cnn,resnet18 --rounds 5
    .venv/bin/python benchmarks/distributed.py --quick            # smoke test: few steps, one round
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

HERE = Path(__file__).resolve().parent
MODELS = {"mlp": ("MLP 784-128-64-10", (784,)), "cnn": ("small CNN", (3, 32, 32)),
          "resnet18": ("ResNet-18 (CIFAR)", (3, 32, 32))}
#: (warm-up steps, timed steps, steps per interleaved block) per model; --quick divides the first two
STEPS = {"mlp": (20, 200, 20), "cnn": (3, 20, 5), "resnet18": (2, 6, 3)}
PER_RANK = 32


# ---------------------------------------------------------------------------------------------- models
def neuroflow_model(name: str) -> Any:
    import neuroflow as nf
    from neuroflow import ops

    nf.manual_seed(0)
    if name == "mlp":
        return nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10))
    if name == "cnn":
        import cnn

        return cnn.build_neuroflow()
    import resnet18

    return resnet18.build_neuroflow()


def torch_model(name: str, state: dict[str, Any]) -> Any:
    import numpy as np
    import torch

    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                    torch.nn.ReLU(), torch.nn.Linear(64, 10))
        model.load_state_dict({k.replace("layers.", ""): torch.from_numpy(np.ascontiguousarray(v))
                               for k, v in state.items()})
        return model
    if name == "cnn":
        import cnn

        return cnn.build_torch(state)
    import resnet18

    return resnet18.build_torch(state)


# ---------------------------------------------------------------------------------------------- one child run
def batch(name: str, rows: int) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    return (rng.standard_normal((rows, *MODELS[name][1])).astype(np.float32),
            rng.integers(0, 10, rows).astype(np.int64))


def timed(step: Any, warmup: int, steps: int, after: Any = None) -> list[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        if after is not None:
            after()
    return times


def interleaved(steps: dict[str, Any], warmup: int, count: int, block: int,
                after: Any = None) -> dict[str, list[float]]:
    """``count`` timed steps of each of ``steps`` (name -> step) after ``warmup`` untimed ones, in blocks of
    ``block`` consecutive steps taken in turn: load and drift on a shared machine hit every contender alike, and
    most steps run as in training, after a step of the same model (a step right after another model's pays
    for caches the other filled: 22.1 against 20.2 ms for the small CNN at one thread). ``after(name)`` runs
    after each timed step."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    while any(len(t) < count for t in times.values()):
        for name, step in steps.items():
            for _ in range(min(block, count - len(times[name]))):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
                if after is not None:
                    after(name)
    return times


def neuroflow_child(name: str, warmup: int, steps: int, comm: Any, bucket_mb: float | None) -> dict[str, Any]:
    """Steps of one process alone, of the data-parallel trainer with its buckets started during backward ("dp")
    and of the same with every bucket started after backward ("dp_after": the whole exchange exposed),
    interleaved; the wait after backward as the engine times it (:attr:`DataParallel.timing`)."""
    import numpy as np

    import neuroflow as nf

    size = comm.Get_size()

    def trainer(distributed: str | None) -> Any:
        return nf.Trainer(neuroflow_model(name), optimizer=nf.optim.SGD(lr=0.01, momentum=0.9), progress=False,
                          batch_size=PER_RANK * (size if distributed else 1), seed=0, distributed=distributed,
                          bucket_mb=bucket_mb)

    alone = trainer(None)
    x, y = batch(name, PER_RANK)
    if size == 1:
        return {"alone": timed(lambda: alone.train_step(x, y), warmup, steps)}
    parallel = trainer("mpi")
    xg, yg = batch(name, PER_RANK * size)
    engine = parallel.parallel

    def data_parallel(overlap: bool) -> Any:
        def step() -> None:
            if engine.reducer is not None:  # (planned by the first step)
                engine.reducer.overlap = overlap  # False: every bucket starts after backward
            parallel.train_step(xg, yg)
        return step

    out: dict[str, Any] = {"exposed": [], "exposed_after": [], "waited": [], "early": []}

    def note(which: str) -> None:
        timing = engine.timing
        if which == "dp":
            out["exposed"].append(timing.exposed_s)
            out["waited"].append(timing.waited_s)
            out["early"].append(float(timing.started_early))
        elif which == "dp_after":
            out["exposed_after"].append(timing.exposed_s)

    out.update(interleaved({"alone": lambda: alone.train_step(x, y), "dp": data_parallel(True),
                            "dp_after": data_parallel(False)}, warmup, steps, min(STEPS[name][2], steps), after=note))
    gradient = np.zeros(parallel.flat_parameters.grad.size, dtype=np.float32)
    out["allreduce"] = timed(lambda: engine.communicator.allreduce_sum(gradient), 2, 10)
    out["buckets"] = len(engine.reducer)
    return out


def torch_child(name: str, warmup: int, steps: int, comm: Any, bucket_mb: float | None) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, size = comm.Get_rank(), comm.Get_size()
    state = dict(neuroflow_model(name).state_dict())
    out: dict[str, Any] = {}

    def stepper(model: Any, rows: int) -> Any:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = batch(name, rows)  # the global batch; DDP's rank takes its rows, as NeuroFlow's does
        if rows > PER_RANK:
            x, y = x[rank * PER_RANK:(rank + 1) * PER_RANK], y[rank * PER_RANK:(rank + 1) * PER_RANK]
        x, y = torch.from_numpy(x), torch.from_numpy(y)

        def step() -> float:
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            return float(loss.item())

        return step

    alone = stepper(torch_model(name, state), PER_RANK)
    if size == 1:
        return {"alone": timed(alone, warmup, steps)}
    port = comm.bcast(_free_port() if rank == 0 else None, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    model = torch.nn.parallel.DistributedDataParallel(torch_model(name, state))
    out.update(interleaved({"alone": alone, "dp": stepper(model, PER_RANK * size)}, warmup, steps,
                           min(STEPS[name][2], steps)))
    gradient = torch.zeros(sum(p.numel() for p in model.parameters()))
    out["allreduce"] = timed(lambda: dist.all_reduce(gradient), 2, 10)
    dist.barrier()  # (no destroy_process_group: with gloo it can wait for ever at exit)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    sys.path.insert(0, str(HERE))
    run = neuroflow_child if args.framework == "neuroflow" else torch_child
    result = run(args.model, args.warmup, args.steps, comm, args.bucket_mb)
    # each rank's medians; the slower rank's is the run's
    medians = {key: statistics.median(values) for key, values in result.items() if isinstance(values, list)}
    gathered = comm.gather(medians, root=0)
    if comm.Get_rank() == 0:
        worst = {key: max(m[key] for m in gathered) for key in medians}
        worst["buckets"] = result.get("buckets")
        Path(args.out).write_text(json.dumps(worst))
    return 0


# ---------------------------------------------------------------------------------------------- the table
def mpiexec() -> str:
    named = os.environ.get("NEUROFLOW_MPIEXEC")
    if named:
        return named
    beside = Path(sys.executable).with_name("mpiexec")
    if not beside.exists():
        raise SystemExit("no mpiexec beside this Python: .venv/bin/pip install mpi4py mpich")
    return str(beside)


def measure(framework: str, model: str, ranks: int, warmup: int, steps: int,
            bucket_mb: float | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        command = [mpiexec(), "-n", str(ranks), sys.executable, __file__, "--child", "--framework", framework,
                   "--model", model, "--warmup", str(warmup), "--steps", str(steps), "--out", str(out)]
        if bucket_mb is not None:
            command += ["--bucket-mb", str(bucket_mb)]
        env = harness.thread_env(1)
        env.pop("NEUROFLOW_DISTRIBUTED", None)
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                             f"{done.stderr[-3000:]}")
        return dict(json.loads(out.read_text()))


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs of one setting over the rounds as one: the median of each time (a rank's median step, the slower
    rank's, per run); the bucket count as it is."""
    return {key: (statistics.median(run[key] for run in runs) if isinstance(runs[0][key], float) else runs[0][key])
            for key in runs[0]}


def hidden(two: dict[str, Any]) -> str:
    """The share of the allreduce backward hid: NeuroFlow's from the engine's timers (the communication left once
    every rank finished backward, with buckets started during backward vs all started after it); PyTorch's from
    the step time beyond 2 ranks alone, over the whole allreduce."""
    if "exposed" in two:
        whole = two["exposed_after"]
        return f"{1 - min(1.0, two['exposed'] / whole):.0%}" if whole > 0 else "-"
    return f"{1 - min(1.0, max(0.0, two['dp'] - two['alone']) / two['allreduce']):.0%} (step time)"


def row(model: str, framework: str, one: dict[str, Any], two: dict[str, Any], bucket_mb: str | None = None) -> list[str]:
    single = PER_RANK / one["alone"]
    double = 2 * PER_RANK / two["dp"]
    name = {"neuroflow": "NeuroFlow (mpi)", "torch": "PyTorch DDP (gloo)"}[framework]
    if bucket_mb is not None:
        name = f"{name[:-1]}, {bucket_mb} MiB buckets)"
    engine = "exposed" in two
    return [MODELS[model][0], name, f"{single:.1f}", f"{double:.1f}", f"{double / (2 * single):.2f}",
            f"{two['alone'] / two['dp']:.2f}", f"{one['alone'] * 1e3:.1f}", f"{two['alone'] * 1e3:.1f}",
            f"{two['dp'] * 1e3:.1f}", f"{two['allreduce'] * 1e3:.1f}",
            f"{two['buckets']}" if engine else "-",
            f"{two['exposed'] * 1e3:.1f} / {two['exposed_after'] * 1e3:.1f}" if engine else "-",
            f"{two['waited'] * 1e3:.1f}" if engine else "-", hidden(two)]


HEADER = ["model", "framework", "1 rank samples/s", "2 ranks samples/s", "efficiency", "vs 2 alone",
          "1 rank step ms", "2 alone step ms", "2 ranks DP step ms", "allreduce ms", "buckets",
          "exposed ms (overlapped / after backward)", "waiting for the slower rank ms", "allreduce hidden"]


def table(report: dict[str, Any]) -> str:
    """The markdown table of ``report`` (what ``--json`` writes: "model/framework[/bucket MiB]" -> the median runs
    of 1 and 2 ranks, and every round's)."""
    rows = [row(*key.split("/")[:2], runs["1"], runs["2"], *key.split("/")[2:]) for key, runs in report.items()]
    return harness.markdown_table(HEADER, rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,cnn,resnet18")
    parser.add_argument("--frameworks", default="neuroflow,torch")
    parser.add_argument("--bucket-mb", type=float, nargs="*", default=None,
                        help="NeuroFlow's bucket sizes to compare (default: the Trainer's default)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="1-rank and 2-rank runs of every framework, in turn, this many times; the table gives "
                             "the median of each time over the rounds (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="few steps: a smoke test, not a measurement")
    parser.add_argument("--json", metavar="PATH", help="also write the measurements as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--framework", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.bucket_mb = args.bucket_mb[0] if args.bucket_mb else None
        return child(args)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1; got {args.rounds}")
    if args.quick:
        args.rounds = 1
    frameworks = [f for f in args.frameworks.split(",") if f]
    if "torch" in frameworks and importlib.util.find_spec("torch") is None:
        print("torch is not installed (.venv/bin/pip install torch==2.13.0): NeuroFlow alone")
        frameworks.remove("torch")
    print(f"machine: {os.cpu_count()} cores, load {harness.machine_load()}; 1 thread per rank, batch {PER_RANK} "
          f"per rank", flush=True)
    rounds: dict[str, list[dict[str, Any]]] = {}
    for model in args.models.split(","):
        warmup, steps, _ = STEPS[model]
        if args.quick:
            warmup, steps = 1, max(2, steps // 10)
        for turn in range(args.rounds):
            # a round runs every framework's 1-rank and 2-rank runs in turn (the first framework rotating), so
            # drift and load over minutes hit the 1-rank references and the 2-rank runs of both alike
            for framework in frameworks[turn % len(frameworks):] + frameworks[:turn % len(frameworks)]:
                one = measure(framework, model, 1, warmup, steps)
                sizes = (args.bucket_mb or [None]) if framework == "neuroflow" else [None]
                for bucket_mb in sizes:
                    two = measure(framework, model, 2, warmup, steps, bucket_mb)
                    key = f"{model}/{framework}" + ("" if bucket_mb is None else f"/{bucket_mb:g}")
                    rounds.setdefault(key, []).append({"1": one, "2": two})
                    print(f"round {turn + 1}: " + " | ".join(row(*key.split("/")[:2], one, two, *key.split("/")[2:])),
                          flush=True)
    report = {key: {"1": median_run([r["1"] for r in runs]), "2": median_run([r["2"] for r in runs]),
                    "rounds": runs} for key, runs in rounds.items()}
    print(f"load at the end: {harness.machine_load()}")
    print()
    print(table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
