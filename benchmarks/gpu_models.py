"""The packaged models' architectures, with random weights, for a GPU machine that cannot take their weights.

A GPU machine reached with a small upload (benchmarks/gpu.sh) gets each packaged model's ``config.json`` and
tokenizer files, a few MB, not its weights (90 MB for MiniLM, 253 MB of GGUF for Gemma 3 270M). ``build`` makes a
checkpoint of the same architecture with weights drawn from the model's own initializer (seed 0): the same shapes,
kernels and memory as the real model, so step times, throughput and peak memory hold for it; its losses and
accuracies mean nothing.

    python benchmarks/gpu_models.py export DIR       # here: copy configs and tokenizers (Gemma's compressed)
    python benchmarks/gpu_models.py build DIR OUT    # there: OUT/minilm and OUT/gemma3-270m, loadable checkpoints
    python benchmarks/gpu_models.py --quick          # export and build MiniLM alone, on the CPU: checks both run
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import tempfile
from pathlib import Path

MINILM_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"]
GEMMA_FILES = ["config.json", "generation_config.json", "tokenizer_config.json"]
MODELS = ("minilm", "gemma3-270m")


def export(target: Path, models: tuple[str, ...] = MODELS) -> None:
    """Copy the packaged models' configs and tokenizers into ``target`` (Gemma's 33 MB tokenizer as .xz)."""
    from fedpeft.models.gguf import cached_gguf_checkpoint
    from fedpeft.models.packaged import _packaged_minilm_dir, packaged_gemma3_source

    minilm = _packaged_minilm_dir()
    (target / "minilm").mkdir(parents=True, exist_ok=True)
    for name in MINILM_FILES:
        shutil.copy(minilm / name, target / "minilm" / name)
    if "gemma3-270m" not in models:
        return
    gemma = cached_gguf_checkpoint(packaged_gemma3_source())
    (target / "gemma3-270m").mkdir(parents=True, exist_ok=True)
    for name in GEMMA_FILES:
        shutil.copy(gemma / name, target / "gemma3-270m" / name)
    with lzma.open(target / "gemma3-270m" / "tokenizer.json.xz", "wb", preset=6) as handle:
        handle.write((gemma / "tokenizer.json").read_bytes())


def build(source: Path, out: Path, models: tuple[str, ...] = MODELS) -> dict[str, int]:
    """Random-weight checkpoints of the exported architectures in ``out`` (float32, seed 0); their parameters."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    built = {}
    for name, auto in (("minilm", AutoModel), ("gemma3-270m", AutoModelForCausalLM)):
        if name not in models:
            continue
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
        built[name] = sum(p.numel() for p in model.parameters())
        print(f"{target}: {built[name] / 1e6:.1f} M parameters")
    return built


def quick() -> dict:
    """MiniLM exported and built into a temporary directory (Gemma's export de-quantizes its GGUF file, minutes),
    then loaded as fedpeft loads a local checkpoint: the parameters built and the LoRA modules fedpeft finds."""
    from fedpeft.core.config import ModelConfig
    from fedpeft.models import count_lora_modules, load_model

    with tempfile.TemporaryDirectory(prefix="gpu-models-") as tmp:
        exported, out = Path(tmp) / "assets", Path(tmp) / "models"
        export(exported, ("minilm",))
        built = build(exported, out, ("minilm",))
        loaded = load_model(ModelConfig(name=str(out / "minilm"), max_length=32), task="classification", num_labels=3)
        return {
            "exported": sorted(path.name for path in (exported / "minilm").iterdir()),
            "parameters": built["minilm"],
            "lora_modules": count_lora_modules(loaded.model, loaded.lora_targets),
        }


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="export and build MiniLM alone: checks that both run")
    commands = parser.add_subparsers(dest="command")
    commands.add_parser("export").add_argument("target", type=Path)
    built = commands.add_parser("build")
    built.add_argument("source", type=Path)
    built.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.quick:
        return quick()
    if args.command == "export":
        export(args.target)
    elif args.command == "build":
        build(args.source, args.out)
    else:
        parser.error("name a command (export or build) or give --quick")
    return None


if __name__ == "__main__":
    main()
