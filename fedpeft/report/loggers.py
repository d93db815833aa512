"""Live metrics of a run for TensorBoard and Weights & Biases (``log: {tensorboard: DIR, wandb: PROJECT}``).

Both are optional: the packages come with ``pip install 'fedpeft[log]'``, and a config that names one that is not
installed is refused with one sentence before anything runs. What is logged:

- after every federated round, the round's training metrics (``train_loss`` where the method reports one,
  ``clients``, ``examples``, ``seconds``) under ``<method>/seed<k>/<metric>`` (``<method>/r<budget>/...`` for a
  method with one federated phase per budget), the round as the step;
- after a method's unit (its personalization and evaluation), the mean of each test metric over the clients of
  each pool under ``<method>/seed<k>/<pool>/<metric>``.

TensorBoard writes event files into ``DIR`` (relative to the run directory unless absolute). W&B starts one run
named after the experiment, in the project ``PROJECT``, with the resolved config; ``WANDB_MODE=offline`` keeps it
on this machine (``wandb sync`` uploads it later).
"""

from __future__ import annotations

import importlib.util
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedpeft.core.errors import UserError
from fedpeft.core.jsontypes import JSONObject

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter
    from wandb import Run


def check_loggers(tensorboard: str | None, wandb: str | None) -> None:
    """Refuse, before a run starts, a logger whose package is not installed."""
    needs = [("log.tensorboard", "tensorboard", tensorboard), ("log.wandb", "wandb", wandb)]
    for key, package, value in needs:
        if value is not None and importlib.util.find_spec(package) is None:
            raise UserError(f"`{key}` needs the {package} package; install it with `pip install 'fedpeft[log]'`.")


class MetricLog:
    """The configured live loggers of one run (none: every call does nothing)."""

    def __init__(
        self, run_dir: Path, name: str, *, tensorboard: str | None, wandb: str | None, config: JSONObject
    ) -> None:
        check_loggers(tensorboard, wandb)
        self._writer: SummaryWriter | None = None
        self._wandb: Run | None = None
        if tensorboard is not None:
            from torch.utils.tensorboard import SummaryWriter

            directory = Path(tensorboard)
            self._writer = SummaryWriter(log_dir=str(directory if directory.is_absolute() else run_dir / directory))
        if wandb is not None:
            import wandb as wandb_module

            self._wandb = wandb_module.init(project=wandb, name=name, config=config, dir=str(run_dir), reinit=True)

    @property
    def active(self) -> bool:
        """Whether any logger is configured (otherwise every call does nothing)."""
        return self._writer is not None or self._wandb is not None

    def scalars(self, prefix: str, values: dict[str, float], step: int | None = None) -> None:
        """Log ``values`` under ``prefix/<name>`` (``step``: the round, if any)."""
        if not self.active:
            return
        tagged = {f"{prefix}/{name}": float(value) for name, value in values.items()}
        if self._writer is not None:
            for tag, value in tagged.items():
                self._writer.add_scalar(tag, value, global_step=step)
            self._writer.flush()
        if self._wandb is not None:
            self._wandb.log({**tagged, **({f"{prefix}/round": step} if step is not None else {})})

    def round(self, label: str, budget: int | None, seed: int, round_: int, metrics: dict[str, float]) -> None:
        """One federated round's training metrics (``round_``: 1-based)."""
        keys = ("train_loss", "clients", "examples", "seconds")
        where = f"{label}/seed{seed}" if budget is None else f"{label}/r{budget}/seed{seed}"
        self.scalars(where, {k: metrics[k] for k in keys if k in metrics}, step=round_)

    def unit(self, records: Sequence[dict]) -> None:
        """The mean test metrics per method, seed and pool of a finished unit's records."""
        if not self.active:
            return
        values: dict[str, dict[str, list[float]]] = {}
        for record in records:
            if record.get("split") == "test":
                prefix = f"{record['method']}/seed{record['seed']}"
                key = f"{record['pool']}/{record['metric']}"
                values.setdefault(prefix, {}).setdefault(key, []).append(float(record["value"]))
        for prefix, metrics in values.items():
            self.scalars(prefix, {k: statistics.fmean(v) for k, v in metrics.items()})

    def close(self) -> None:
        """Close the TensorBoard writer and finish the W&B run, where configured."""
        if self._writer is not None:
            self._writer.close()
        if self._wandb is not None:
            self._wandb.finish()
