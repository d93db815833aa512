"""The devices a plan times its work on: GPUs from their datasheets, this machine's CPU from one measured matmul.

A GPU's time is its FLOPs over (peak dense bf16 FLOPs x :data:`ASSUMED_MFU`), and a generated token at least one
read of the weights at the memory bandwidth. Both are assumptions until a real run measures them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

ASSUMED_MFU = 0.30
"""Model FLOPs utilisation assumed for training and prompt processing: the share of the peak that the model's
FLOPs (2 N per token forward, docs/plan.md) reach. 0.3 is a typical figure for fine-tuning on one GPU: large-model
pre-training reaches 0.4 to 0.55 (PaLM 46 %, Chowdhery et al., 2022, Table 3; Megatron-LM, Narayanan et al., 2021,
52 %), LoRA fine-tuning at small batches and short sequences less. An assumption until measured on a real run."""

GENERATION_BANDWIDTH_SHARE = 0.6
"""The share of the memory bandwidth a decoding step reaches when it reads the weights (an assumption)."""

CUDA_CONTEXT_BYTES = 512 * 2**20
"""The CUDA context and PyTorch's allocator reserve per worker process, added to each worker's peak (assumed)."""


@dataclass(frozen=True)
class Gpu:
    """A GPU's datasheet: peak dense bf16 tensor FLOPs (without sparsity), memory in GiB, bandwidth in bytes/s."""

    name: str
    bf16_flops: float
    memory_gib: float
    bandwidth: float
    source: str


# NVIDIA datasheets; dense figures (the sheets print bf16 "with sparsity", twice these).
GPUS: dict[str, Gpu] = {
    gpu.name.lower(): gpu
    for gpu in (
        Gpu("H100", 989e12, 80, 3.35e12, "NVIDIA H100 datasheet, SXM5"),
        Gpu("H100-PCIe", 756e12, 80, 2.0e12, "NVIDIA H100 datasheet, PCIe"),
        Gpu("H200", 989e12, 141, 4.8e12, "NVIDIA H200 datasheet, SXM"),
        Gpu("A100-40GB", 312e12, 40, 1.555e12, "NVIDIA A100 datasheet"),
        Gpu("A100-80GB", 312e12, 80, 2.039e12, "NVIDIA A100 datasheet, SXM"),
        Gpu("L40S", 362e12, 48, 0.864e12, "NVIDIA L40S datasheet"),
        Gpu("L4", 121e12, 24, 0.3e12, "NVIDIA L4 datasheet"),
        Gpu("A10", 125e12, 24, 0.6e12, "NVIDIA A10 datasheet"),
        Gpu("RTX-4090", 165e12, 24, 1.008e12, "NVIDIA Ada Lovelace architecture whitepaper (FP32 accumulate)"),
    )
}

MEMORY_ROWS_GIB = (24, 40, 80)
"""The GPU memories the text table says the worker counts fit in."""


def gpu(name: str) -> Gpu | None:
    """The GPU named ``name`` (case-insensitive), or None."""
    return GPUS.get(name.strip().lower())


def measure_cpu_flops(size: int = 384, seconds: float = 0.3) -> float:
    """This machine's float32 matmul rate (FLOPs/s): the best of ``size`` x ``size`` products repeated for about
    ``seconds``, numpy's BLAS on every core (a quick upper bound of what training reaches on it).

    On a machine shared with other jobs the BLAS threads seldom get every core at once (here: from 3 to 290
    GFLOP/s a few seconds apart), so one thread is timed too and counted at :data:`THREAD_SCALING` of a core each
    (one thread held 167 to 180 GFLOP/s here, two 287 to 292 when the cores were free); the larger rate is kept."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((size, size), dtype=np.float32), rng.standard_normal((size, size), dtype=np.float32)
    a @ b  # warm the BLAS threads
    flops = 2.0 * size**3
    every = flops / _best(lambda: a @ b, seconds)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return every
    with threadpool_limits(1):
        one = flops / _best(lambda: a @ b, seconds)
    return max(every, one * THREAD_SCALING * _cores())


THREAD_SCALING = 0.8
"""The share of one thread's matmul rate each further core adds (two threads 0.83 of twice one, here)."""


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _best(work: Callable[[], object], seconds: float, least: int = 3, most: int = 500) -> float:
    """The shortest of the times ``work`` took, run at least ``least`` times and until ``seconds`` have passed."""
    best, began, runs = float("inf"), time.perf_counter(), 0
    while runs < least or (time.perf_counter() - began < seconds and runs < most):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
        runs += 1
    return max(best, 1e-9)
