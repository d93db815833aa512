"""The Flower app of fedpeft for ``flwr run .``: a ServerApp that runs an experiment and the ClientApp.

The ServerApp reads the run config (``[tool.flwr.app.config]`` in pyproject.toml, overridden with
``flwr run . <connection> --run-config "key=value ..."``):

- ``config``: a preset name or the path of a YAML config file, on the SuperLink's machine;
- ``overrides``: ``key=value`` overrides separated by semicolons (``"seeds=[0];methods.0.rounds=5"``);
- ``out``: the output directory on the SuperLink's machine (empty: ``runs/<name>``);
- ``resume``: continue the run in ``out``;
- ``node-timeout``: seconds to wait for SuperNodes to serve every partition;
- ``reply-timeout``: seconds to wait for a client's reply before leaving it out (0: no limit).

Then it runs the same :class:`~fedpeft.runner.Experiment` as ``fedpeft run`` does, with its clients' work sent to
the SuperNodes through :class:`~fedpeft.engine.flower.GridEngine`.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch  # noqa: F401  (ArrayRecord.to_torch_state_dict needs torch imported)
from flwr.app import Context, UserConfig
from flwr.serverapp import Grid, ServerApp

from fedpeft.core.config import load_config
from fedpeft.core.errors import UserError
from fedpeft.engine.flower import GridEngine, client_app, flower_config

log = logging.getLogger("fedpeft")

__all__ = ["client_app", "server_app"]

server_app = ServerApp()


def _overrides(text: str) -> list[str]:
    return [part.strip() for part in text.split(";") if part.strip()]


def run_from_run_config(grid: Grid, run_config: UserConfig) -> Path:
    """Run the experiment the run config names over ``grid``; returns the output directory."""
    from fedpeft.runner import Experiment

    source = str(run_config.get("config", "") or "")
    if not source:
        raise UserError("The run config names no experiment; pass --run-config \"config='<preset or YAML path>'\".")
    cfg = flower_config(load_config(source, _overrides(str(run_config.get("overrides", "") or ""))))
    out = Path(str(run_config.get("out", "") or "")) if run_config.get("out") else Path("runs") / cfg.name
    reply_timeout = float(run_config.get("reply-timeout", 0) or 0) or None
    node_timeout = float(run_config.get("node-timeout", 120) or 120)
    log.info("running %s with the flower engine into %s", source, out.resolve())
    experiment = Experiment(cfg, out)
    experiment.run(
        resume=bool(run_config.get("resume", False)),
        engine_factory=lambda worker: GridEngine(grid, worker, reply_timeout=reply_timeout, node_timeout=node_timeout),
    )
    log.info("outputs written to %s", out.resolve())
    return out


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """ServerApp entry point: run the experiment of the run config; a user error ends in one clear line."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s fedpeft: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    try:
        run_from_run_config(grid, context.run_config)
    except UserError as err:
        log.error("error: %s", err)
        raise
