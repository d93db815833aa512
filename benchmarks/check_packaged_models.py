"""Check the two packaged pretrained models against their real weights, and time them.

- Gemma 3 270M (``gemma3-270m``): the first load joins the GGUF parts, de-quantizes them through transformers
  and caches the result as safetensors; a second load reads the cache. Then greedy generation of a few tokens,
  and the classification variant loaded from the same cache.
- all-MiniLM-L6-v2 (``minilm``): load from its package with a fresh 3-way head, classify a batch (forward
  time), and one forward + backward pass (the cost of a training step).

Not a test: it takes a few minutes and a few GB of memory. By default it uses a fresh temporary cache
root so that the first Gemma load really de-quantizes; pass ``--cache DIR`` to use (and keep) another one.

``--quick``: MiniLM alone, a batch of 4, one timed pass (seconds; Gemma's first load de-quantizes for minutes).

Usage: python benchmarks/check_packaged_models.py [--cache DIR] [--tokens 12] [--batch 32] [--out FILE.json] [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from fedpeft.core.config import ModelConfig  # noqa: F401
from fedpeft.models import count_lora_modules, load_model, max_rank  # noqa: E402
from fedpeft.models import gguf as gguf_cache  # noqa: E402
from fedpeft.models.packaged import GEMMA3_270M_SHA256  # noqa: E402

REPEATS = 5  # timings on shared machines are noisy: report the median and the best of several runs
PROMPTS = ["The capital of France is", "Die Hauptstadt von Deutschland ist"]
TEXTS = [
    "The service was quick and the food was excellent.",
    "I would not recommend this hotel to anyone.",
    "Le film était long mais les acteurs sont formidables.",
    "El producto llegó roto y nadie respondió a mis mensajes.",
]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def check_gemma(tokens: int, repeats: int = REPEATS) -> dict:
    cfg = ModelConfig(name="gemma3-270m", max_length=64)
    cold, cold_s = timed(lambda: load_model(cfg, task="generation"))
    record = gguf_cache.source_record(GEMMA3_270M_SHA256)
    del cold
    gc.collect()
    cached_s = []
    for _ in range(2):
        start = time.perf_counter()
        loaded = load_model(cfg, task="generation")
        cached_s.append(time.perf_counter() - start)
    model, tok = loaded.model, loaded.tokenizer
    batch = tok(PROMPTS, padding=True, return_tensors="pt")
    gen_s = []
    with torch.no_grad():
        model.generate(**batch, max_new_tokens=1, do_sample=False)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(**batch, max_new_tokens=tokens, do_sample=False)
            gen_s.append(time.perf_counter() - start)
    width = batch["input_ids"].shape[1]
    continuations = [tok.decode(row[width:], skip_special_tokens=True) for row in out]
    result = {
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "first_load_s": round(cold_s, 1),
        "dequantize_s": record["dequantize_seconds"],
        "cached_load_s": [round(x, 2) for x in cached_s],
        "cache_dir": str(gguf_cache.gguf_cache_dir(GEMMA3_270M_SHA256)),
        "cache_size_mb": round(
            sum(p.stat().st_size for p in gguf_cache.gguf_cache_dir(GEMMA3_270M_SHA256).iterdir()) / 2**20
        ),
        "lora_modules": count_lora_modules(model, loaded.lora_targets),
        "max_rank": max_rank(model, loaded.lora_targets),
        "generate_tokens": tokens,
        "generate_batch": len(PROMPTS),
        "generate_s_median": round(statistics.median(gen_s), 2),
        "generate_s_min": round(min(gen_s), 2),
        "generations": [p + c for p, c in zip(PROMPTS, continuations, strict=True)],
    }
    del loaded, model
    gc.collect()
    classifier, cls_s = timed(lambda: load_model(cfg, task="classification", num_labels=3))
    with torch.no_grad():
        logits = classifier.model(**classifier.tokenizer(TEXTS, padding=True, return_tensors="pt")).logits
    result.update(classification_load_s=round(cls_s, 2), classification_logits_shape=list(logits.shape))
    return result


def check_minilm(batch_size: int, repeats: int = REPEATS) -> dict:
    cfg = ModelConfig(name="minilm", max_length=64)
    loaded, load_s = timed(lambda: load_model(cfg, task="classification", num_labels=3))
    model, tok = loaded.model, loaded.tokenizer
    texts = [TEXTS[i % len(TEXTS)] for i in range(batch_size)]
    batch = tok(texts, padding="max_length", truncation=True, max_length=64, return_tensors="pt")
    forward_s = []
    with torch.no_grad():
        model(**batch)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            logits = model(**batch).logits
            forward_s.append(time.perf_counter() - start)
    model.train()
    labels = torch.zeros(batch_size, dtype=torch.long)
    model(**batch, labels=labels).loss.backward()  # warm-up
    step_s = []
    for _ in range(repeats):
        model.zero_grad()
        start = time.perf_counter()
        model(**batch, labels=labels).loss.backward()
        step_s.append(time.perf_counter() - start)
    return {
        "parameters_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
        "load_s": round(load_s, 2),
        "batch": batch_size,
        "seq_len": int(batch["input_ids"].shape[1]),
        "forward_s_median": round(statistics.median(forward_s), 3),
        "forward_s_min": round(min(forward_s), 3),
        "forward_backward_s_median": round(statistics.median(step_s), 3),
        "forward_backward_s_min": round(min(step_s), 3),
        "predictions": logits.argmax(-1)[: len(TEXTS)].tolist(),
        "lora_modules": count_lora_modules(model, loaded.lora_targets),
        "max_rank": max_rank(model, loaded.lora_targets),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, help="cache root to use and keep (default: a fresh temporary one)")
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--quick", action="store_true", help="MiniLM alone, batch 4, one timed pass")
    args = parser.parse_args(argv)

    root = args.cache or Path(tempfile.mkdtemp(prefix="fedpeft-cache-"))
    before = os.environ.get("FEDPEFT_CACHE")
    os.environ["FEDPEFT_CACHE"] = str(root)
    try:
        report = {
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, torch threads {torch.get_num_threads()}",
            "torch": torch.__version__,
        }
        if args.quick:
            report["minilm"] = check_minilm(4, repeats=1)
        else:
            report["gemma3-270m"] = check_gemma(args.tokens)
            report["minilm"] = check_minilm(args.batch)
        report["peak_rss_mb"] = round(peak_rss_mb())
    finally:
        if before is None:
            os.environ.pop("FEDPEFT_CACHE", None)
        else:
            os.environ["FEDPEFT_CACHE"] = before
        if args.cache is None:
            shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
