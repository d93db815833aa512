"""The packaged models' architectures, with random weights, for a GPU machine that cannot take their weights.

A GPU machine reached with a small upload (benchmarks/gpu.sh) gets each packaged model's ``config.json`` and
tokenizer files, a few MB, not its weights (90 MB for MiniLM, 253 MB of GGUF for Gemma 3 270M). ``build`` makes a
checkpoint of the same architecture with weights drawn from the model's own initializer (seed 0): the same shapes,
kernels and memory as the real model, so step times, throughput and peak memory hold for it; its losses and
accuracies mean nothing.

    python benchmarks/gpu_models.py export DIR       # here: copy configs and tokenizers (Gemma's compressed)
    python benchmarks/gpu_models.py build DIR OUT    # there: OUT/minilm and OUT/gemma3-270m, loadable checkpoints
"""

from __future__ import annotations

import argparse
import lzma
import shutil
from pathlib import Path

MINILM_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"]
GEMMA_FILES = ["config.json", "generation_config.json", "tokenizer_config.json"]


def export(target: Path) -> None:
    """Copy the packaged models' configs and tokenizers into ``target`` (Gemma's 33 MB tokenizer as .xz)."""
    from fedpeft.models.gguf import cached_gguf_checkpoint
    from fedpeft.models.packaged import _packaged_minilm_dir, packaged_gemma3_source

    minilm = _packaged_minilm_dir()
    (target / "minilm").mkdir(parents=True, exist_ok=True)
    for name in MINILM_FILES:
        shutil.copy(minilm / name, target / "minilm" / name)
    gemma = cached_gguf_checkpoint(packaged_gemma3_source())
    (target / "gemma3-270m").mkdir(parents=True, exist_ok=True)
    for name in GEMMA_FILES:
        shutil.copy(gemma / name, target / "gemma3-270m" / name)
    with lzma.open(target / "gemma3-270m" / "tokenizer.json.xz", "wb", preset=6) as handle:
        handle.write((gemma / "tokenizer.json").read_bytes())


def build(source: Path, out: Path) -> None:
    """Random-weight checkpoints of the exported architectures in ``out`` (float32, seed 0)."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    for name, auto in (("minilm", AutoModel), ("gemma3-270m", AutoModelForCausalLM)):
        target = out / name
        target.mkdir(parents=True, exist_ok=True)
        for path in (source / name).iterdir():
            if path.suffix == ".xz":
                with lzma.open(path) as handle:
                    (target / path.stem).write_bytes(handle.read())
            else:
                shutil.copy(path, target / path.name)
        torch.manual_seed(0)
        model = auto.from_config(AutoConfig.from_pretrained(target), dtype=torch.float32)
        model.save_pretrained(target)
        print(f"{target}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("export").add_argument("target", type=Path)
    built = commands.add_parser("build")
    built.add_argument("source", type=Path)
    built.add_argument("out", type=Path)
    args = parser.parse_args()
    if args.command == "export":
        export(args.target)
    else:
        build(args.source, args.out)


if __name__ == "__main__":
    main()
