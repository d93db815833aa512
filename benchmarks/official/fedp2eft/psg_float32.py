"""The authors' FedP2EFT with its PSG kept in float32: one change to their client, against their own pipeline.

Their client casts the PSG and its input statistics to bfloat16 before their first use and trains the PSG there
(docs/methods/fedp2eft.md, "Where the authors' code departs from its paper"). This reruns their FedP2EFT steps of
one seed of a finished ``compare.py run`` folder with ``variants/psg-float32.patch`` applied (the two casts kept in
float32, nothing else), then sets the personalized accuracies beside those of their unchanged pipeline and of
fedpeft's run of the paired seed, client by client.

Each step is the ``compare.py`` step's own command (from its log), with the patched copy of their code, this
folder's model directory and the step's name changed; the same federation, base model, protocol and seed.

Usage: python benchmarks/official/fedp2eft/psg_float32.py --run runs/official-fedp2eft/aligned
       [--out runs/official-fedp2eft/psg-float32] [--position 0] [--cells r2-seen r2-unseen ...] [--report-only]

Needs setup.sh's work folder (their patched code and environment) and the ``--run`` folder's federated step and
the personalization steps named in ``--cells`` (their logs give the commands).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # as compare.py does for comparison.py

import comparison  # noqa: E402
from rerun import compare_cells, patched_copy, replaced, rerun_steps, their_command, variant_arguments, write_table  # noqa: E402

__all__ = ["main", "retarget", "their_command"]

PATCH = HERE / "variants" / "psg-float32.patch"
PREFIX = "f32"


def retarget(words: list[str], work: Path, repo: Path, models: Path, old_models: Path, seed: int) -> list[str]:
    """A step's command for the variant: the patched repository, this folder's models, the step renamed."""
    step = f"fedp2eft-s{seed}-"
    pairs = [(str(work / "repo"), str(repo)), (str(old_models), str(models)), (f"authors-{step}", f"{PREFIX}-{step}")]
    return replaced(words, pairs)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    variant_arguments(parser, Path("runs/official-fedp2eft/psg-float32"))
    args = parser.parse_args(argv)
    run, out, work = args.run.resolve(), args.out.resolve(), args.work.resolve()
    plan = json.loads((run / "plan.json").read_text())
    seed = comparison.their_seed(args.position)
    authors = out / "authors"

    steps = [f"authors-fedp2eft-s{seed}-federated", *(f"authors-fedp2eft-s{seed}-{cell}" for cell in args.cells)]
    if not args.report_only:
        repo = patched_copy(work / "repo", out / "repo", PATCH)
        models, old_models = authors / "models", run / "authors" / "models"
        python = work / "venv" / "bin" / "python"
        rerun_steps(
            run, out, steps, PREFIX, python, lambda words: retarget(words, work, repo, models, old_models, seed)
        )

    fedpeft_seed = plan["seeds"][args.position]
    keys = ("float32_minus_bfloat16", "fedpeft_minus_float32", "fedpeft_minus_bfloat16")
    rows = compare_cells(run, out, PREFIX, ("fedp2eft", "fedp2eft"), (seed, fedpeft_seed), args.cells, keys)
    result = {"run": str(run), "their_seed": seed, "fedpeft_seed": fedpeft_seed, "patch": PATCH.name, "rows": rows}
    # each difference's two sides, in the order its "fedpeft" and "authors" fields hold them
    result["sides"] = {
        "float32_minus_bfloat16": ["theirs, PSG in float32", "theirs, unchanged"],
        "fedpeft_minus_float32": ["fedpeft", "theirs, PSG in float32"],
        "fedpeft_minus_bfloat16": ["fedpeft", "theirs, unchanged"],
    }
    headers = ("their PSG in float32 - in bfloat16", "fedpeft - their float32", "fedpeft - their bfloat16")
    write_table(out / "psg_float32.json", result, keys, headers)
    return result


if __name__ == "__main__":
    main()
