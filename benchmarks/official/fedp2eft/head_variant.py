"""The authors' LoRA, BayesTune-LoRA or FedP2EFT with fedpeft's targets: the encoder's LoRA, the head trained whole.

Their configs adapt ``all-linear`` modules: with PEFT 0.12 and no task type, that is every linear layer of the
sequence classifier, BERT's pooler and the classifier included, and no module is trained whole. BayesTune-LoRA then
prunes the ranks of all of them to one budget, and their runs keep 47.6 % (r = 2) to 19.9 % (r = 16) of the kept
ranks in those two modules (docs/results/official-fedp2eft.md). fedpeft adapts the encoder's linear layers and
trains the head (pooler and classifier) whole, as PEFT's sequence-classification task type does. This reruns their
steps of one method (``--method btlora``, ``lora`` or ``fedp2eft``) and seed of a finished ``compare.py run``
folder with two more arguments of their own ``main.py`` (no change to their code)::

    models.net.args.adapter_args.target_modules=['query','key','value','output.dense','intermediate.dense']
    models.net.args.adapter_args.modules_to_save=['pooler','classifier']

(PEFT matches a name by its suffix: ``output.dense`` is the attention's and the block's output, not
``pooler.dense``), then sets the personalized accuracies beside those of their unchanged pipeline and of fedpeft's
run of the paired seed, client by client. A BayesTune-LoRA cell of budget r < 16 loads the scales of the pool's
r = 16 step (as theirs does), and FedP2EFT's cells the PSG of its federated step: this runs those first.

FedP2EFT's client needs one cast more, ``variants/head-weights-float32.patch``: its evaluation hands the trained
weights to numpy, which has no bfloat16, and a head trained whole is in the model's bfloat16 where LoRA's weights
are float32 (their other clients cast there already). Its steps run on a copy of their code with that patch.

Usage: python benchmarks/official/fedp2eft/head_variant.py --run runs/official-fedp2eft/aligned [--method btlora]
       [--out runs/official-fedp2eft/head-variant] [--position 0] [--cells r2-seen ...] [--report-only]

Needs setup.sh's work folder (their patched code and environment) and the ``--run`` folder's steps named in
``--cells`` (and, for BayesTune-LoRA, their pools' r = 16 steps): their logs give the commands.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # as compare.py does for comparison.py

import comparison  # noqa: E402
from rerun import compare_cells, compare_pooled, patched_copy, replaced, rerun_steps, variant_arguments, write_table  # noqa: E402

PREFIX = "head"
PATCHES = {"fedp2eft": HERE / "variants" / "head-weights-float32.patch"}  # their code's changes a method needs here
FEDPEFT_METHOD = {"btlora": "bayestune_lora", "lora": "lora", "fedp2eft": "fedp2eft"}  # their steps' name, fedpeft's
# Python literals: their config.py reads an argument's value with ast.literal_eval (bare words stay one string).
TARGETS = "models.net.args.adapter_args.target_modules=['query','key','value','output.dense','intermediate.dense']"
HEAD = "models.net.args.adapter_args.modules_to_save=['pooler','classifier']"


def retarget(
    words: list[str],
    models: Path,
    old_models: Path,
    seed: int,
    method: str = "btlora",
    code: tuple[Path, Path] | None = None,
) -> list[str]:
    """A step's command for the variant: this folder's models, the step renamed, fedpeft's targets and head (and,
    with ``code``, their code's copy instead of their work folder's: ``(work folder's, copy)``)."""
    step = f"{method}-s{seed}-"
    pairs = [] if code is None else [(str(code[0]), str(code[1]))]
    pairs += [(str(old_models), str(models)), (f"authors-{step}", f"{PREFIX}-{step}")]
    return [*replaced(words, pairs), TARGETS, HEAD]


def steps_of(cells: list[str], seed: int, method: str = "btlora") -> list[str]:
    """The authors' step names to rerun for ``cells``; first, for BayesTune-LoRA each pool's r = 16 step (the
    scales the others load), for FedP2EFT the federated training of its PSG (whose outputs are per adapted module)."""
    if method == "fedp2eft":
        return [f"authors-fedp2eft-s{seed}-federated", *(f"authors-fedp2eft-s{seed}-{cell}" for cell in cells)]
    if method != "btlora":
        return [f"authors-{method}-s{seed}-{cell}" for cell in cells]
    pools = sorted({cell.split("-")[1] for cell in cells})
    first = [f"authors-btlora-s{seed}-r16-{pool}" for pool in pools]
    rest = [f"authors-btlora-s{seed}-{cell}" for cell in cells if not cell.startswith("r16-")]
    return [*first, *rest]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    variant_arguments(parser, Path("runs/official-fedp2eft/head-variant"))
    parser.add_argument("--method", choices=sorted(FEDPEFT_METHOD), default="btlora", help="their method's name")
    parser.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        help="compare only, over the seed pairs 0, 1, ... whose variant folders (--out of each) these are, a "
        "client's value its mean over them; written to head-METHOD-pooled.json in --out",
    )
    args = parser.parse_args(argv)
    run, out, work = args.run.resolve(), args.out.resolve(), args.work.resolve()
    plan = json.loads((run / "plan.json").read_text())
    seed = comparison.their_seed(args.position)
    method, ours_name = args.method, FEDPEFT_METHOD[args.method]
    authors = out / "authors"

    if not (args.report_only or args.pool):
        code = (
            (work / "repo", patched_copy(work / "repo", out / "repo", PATCHES[method])) if method in PATCHES else None
        )
        models, old_models = authors / "models", run / "authors" / "models"
        rerun_steps(
            run,
            out,
            steps_of(args.cells, seed, method),
            PREFIX,
            work / "venv" / "bin" / "python",
            lambda words: retarget(words, models, old_models, seed, method, code),
        )

    keys = ("head_minus_unchanged", "fedpeft_minus_head", "fedpeft_minus_unchanged")
    if args.pool:
        pairs = [
            (comparison.their_seed(position), plan["seeds"][position], folder.resolve())
            for position, folder in enumerate(args.pool)
        ]
        rows = compare_pooled(run, pairs, PREFIX, (method, ours_name), args.cells, keys)
        their_seeds, fedpeft_seeds = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
    else:
        their_seeds, fedpeft_seeds = [seed], [plan["seeds"][args.position]]
        rows = compare_cells(run, out, PREFIX, (method, ours_name), (seed, fedpeft_seeds[0]), args.cells, keys)
    result = {
        "run": str(run),
        "their_seed": their_seeds if args.pool else their_seeds[0],
        "fedpeft_seed": fedpeft_seeds if args.pool else fedpeft_seeds[0],
        "method": method,
        "arguments": [TARGETS, HEAD],
        "patch": PATCHES[method].name if method in PATCHES else None,
        "rows": rows,
    }
    # each difference's two sides, in the order its "fedpeft" and "authors" fields hold them
    result["sides"] = {
        "head_minus_unchanged": ["theirs, fedpeft's targets and head", "theirs, unchanged"],
        "fedpeft_minus_head": ["fedpeft", "theirs, fedpeft's targets and head"],
        "fedpeft_minus_unchanged": ["fedpeft", "theirs, unchanged"],
    }
    headers = ("theirs with fedpeft's targets - unchanged", "fedpeft - theirs with them", "fedpeft - unchanged")
    write_table(out / f"head-{method}{'-pooled' if args.pool else ''}.json", result, keys, headers)
    return result


if __name__ == "__main__":
    main()
