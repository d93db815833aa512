"""The Flower apps of fedpeft: ``flwr run .`` (a ServerApp that runs an experiment, and the ClientApp) and
``fedpeft run --engine flower`` (the same on Flower's simulation engine, :func:`run_flower_simulation`).

The ServerApp reads the run config (``[tool.flwr.app.config]`` in pyproject.toml, overridden with
``flwr run . <connection> --run-config "key=value ..."``):

- ``config``: a preset name or the path of a YAML config file, on the SuperLink's machine;
- ``overrides``: ``key=value`` overrides separated by semicolons (``"seeds=[0];methods.0.rounds=5"``);
- ``out``: the output directory on the SuperLink's machine (empty: ``runs/<name>``);
- ``resume``: continue the run in ``out``;
- ``node-timeout``: seconds to wait for SuperNodes to serve every partition;
- ``reply-timeout``: seconds to wait for a client's reply before leaving it out (0: no limit).

Then it runs the same :class:`~fedpeft.runner.Experiment` as ``fedpeft run`` does, with its clients' work sent to
the SuperNodes through :class:`~fedpeft.engine.flower.grid.GridEngine`, printing the plain progress lines of a
redirected local run (one per stage and round) to its log, which ``flwr run --stream`` (``fedpeft launch``) shows.
However the run ends while Flower still lets it send (completed, refused at start, a user error, any failure), the
ServerApp tells every node that the run is over, so that each ends the worker process it kept for the run; while
it runs, its keepalives renew those workers' leases (:mod:`fedpeft.engine.flower.keepalive`), so that the workers
of a run stopped with ``flwr stop`` or cut off from a lost SuperLink end on their own. A SuperLink restarted with its
database does not end the run: it goes on once the SuperLink answers again (:mod:`fedpeft.engine.flower.link_watch`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import socket
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch  # noqa: F401  (ArrayRecord.to_torch_state_dict needs torch imported)
from flwr.app import Context, UserConfig
from flwr.serverapp import Grid, ServerApp

from fedpeft.apps.launch import SERVERAPP_WAIT_SECONDS
from fedpeft.core.config import EngineConfig, ExperimentConfig, load_config
from fedpeft.core.errors import AllClientsFailedError, MissingResultsError, UserError
from fedpeft.core.io import path_component
from fedpeft.core.logs import quiet_library_output
from fedpeft.core.processes import end_descendants
from fedpeft.core.progress import Progress
from fedpeft.engine.flower import GridEngine, client_app, flower_config
from fedpeft.engine.flower.grid import end_run_on_nodes
from fedpeft.engine.flower.keepalive import Keepalive
from fedpeft.engine.flower.link_watch import SuperLinkWatch
from fedpeft.engine.flower.membership import register_sites
from fedpeft.runner import Experiment

if TYPE_CHECKING:
    from flwr.server.superlink.fleet.vce.backend.backend import BackendConfig

log = logging.getLogger("fedpeft")

__all__ = ["client_app", "run_flower_simulation", "server_app"]

server_app = ServerApp()


def _overrides(text: str) -> list[str]:
    return [part.strip() for part in text.split(";") if part.strip()]


def run_from_run_config(
    grid: Grid, run_config: UserConfig, *, progress: Progress | None = None, closes_run: bool = True
) -> Path:
    """Run the experiment the run config names over ``grid``; returns the output directory. ``progress`` and
    ``closes_run`` as in :func:`run_over_grid`."""
    source = str(run_config.get("config", "") or "")
    if not source:
        raise UserError("The run config names no experiment; pass --run-config \"config='<preset or YAML path>'\".")
    cfg = flower_config(load_config(source, _overrides(str(run_config.get("overrides", "") or ""))))
    default = Path("runs") / path_component(cfg.name)  # the name is one directory below runs/
    out = Path(str(run_config.get("out", "") or "")) if run_config.get("out") else default
    reply_timeout = float(run_config.get("reply-timeout", 0) or 0) or None
    node_timeout = float(run_config.get("node-timeout", 120) or 120)
    log.info("running %s with the flower engine into %s", source, out.resolve())
    run_over_grid(
        grid,
        cfg,
        out,
        resume=bool(run_config.get("resume", False)),
        reply_timeout=reply_timeout,
        node_timeout=node_timeout,
        progress=progress,
        closes_run=closes_run,
    )
    log.info("outputs written to %s", out.resolve())
    return out


def run_over_grid(
    grid: Grid,
    cfg: ExperimentConfig,
    out: Path,
    *,
    resume: bool = False,
    reply_timeout: float | None = None,
    node_timeout: float = 120.0,
    progress: Progress | None = None,
    closes_run: bool = True,
) -> Path:
    """Run the experiment ``cfg`` (a :func:`flower_config`) with its clients' work sent over ``grid``; with
    site-local data (``data.sites``) the nodes first say which clients they hold. ``progress`` shows the stages,
    rounds and clients; ``closes_run``: the engine tells the serving nodes when the run is over (the ServerApp
    tells every node itself instead, however the run ends)."""
    data, sites = None, None
    if cfg.data.sites is not None:
        check_site_models(cfg)
        data, sites, cfg = register_sites(grid, cfg, node_timeout=node_timeout)
    # The base model's evaluation runs alongside the methods: one unit more than the methods at once.
    concurrent = 1 if cfg.engine.secagg is not None else (cfg.engine.concurrent_methods or len(cfg.methods)) + 1
    progress = progress or Progress()
    return Experiment(cfg, out, progress, data=data).run(
        resume=resume,
        engine_factory=lambda worker: GridEngine(
            grid,
            worker,
            on_client=progress.advance_client,
            reply_timeout=reply_timeout,
            node_timeout=node_timeout,
            sites=sites,
            concurrent_units=concurrent,
            closes_run=closes_run,
        ),
    )


def check_site_models(cfg: ExperimentConfig) -> None:
    """Refuse, before any node starts, a model whose tokenizer is trained on the data when the data stays on its
    sites (the server would need every site's texts)."""
    from fedpeft.core.registry import MODELS

    for model in cfg.models.values() if cfg.models else [cfg.model]:
        if model.name in MODELS and getattr(MODELS.get(model.name), "needs_corpus", False):
            raise UserError(
                f"Model {model.name} trains its tokenizer on the dataset's texts, which stay on their sites with "
                "data.sites; use a model with its own tokenizer (a hub id, a local checkpoint or minilm)."
            )


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    """ServerApp entry point: run the experiment of the run config, with the progress lines of a redirected local
    run; a user error ends in one clear line. However the run ends while Flower lets it send, every node is told
    that it is over; a run that Flower stopped (``flwr stop``) can send nothing, and the workers' leases end them.
    A restart of the SuperLink (with its database) does not end the run (:class:`SuperLinkWatch`)."""
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s fedpeft: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    quiet_library_output(keep=("flwr",))  # the launcher streams this output: fedpeft's and Flower's lines only
    failure: Exception | None = None
    with Keepalive(grid), SuperLinkWatch(grid, SERVERAPP_WAIT_SECONDS):
        try:
            run_from_run_config(grid, context.run_config, progress=Progress(plain=True), closes_run=False)
        except (UserError, AllClientsFailedError, MissingResultsError) as err:
            failure = err
        except Exception:
            _end_run(grid)
            raise
    _end_run(grid)
    if failure is not None:  # one sentence, no traceback: the run failed
        from flwr.supercore.exit import ExitCode, flwr_exit

        stopped = isinstance(failure, AllClientsFailedError)
        hint = "; continue it with resume=true (fedpeft launch --resume) once the nodes are back" if stopped else ""
        flwr_exit(ExitCode.SERVERAPP_EXCEPTION, f"error: {'the run stopped: ' if stopped else ''}{failure}{hint}")


def _end_run(grid: Grid) -> None:
    """Tell every node the run is over (:func:`end_run_on_nodes`); a failure to do so is logged, never raised over
    the run's own outcome (the workers' leases end them then)."""
    try:
        end_run_on_nodes(grid, timeout=30.0)
    except Exception as err:
        log.warning("could not tell the nodes that the run is over (%r); their workers end on their own", err)


SIMULATION_NODE_TIMEOUT = 600.0
"""Seconds the simulation waits for its virtual SuperNodes (Ray's start on a loaded machine can take minutes; the
nodes are this process's own, so a longer wait never hides a missing machine)."""


def simulation_backend(engine: EngineConfig, cuda: bool, *, verbose: bool = False) -> BackendConfig:
    """The Ray backend of Flower's simulation engine: where Ray runs and what one client's work takes.

    Without ``engine.ray_address``, Ray starts in this process with at most ``num_supernodes`` clients at once,
    each ``client_cpus`` of this machine's cores, sharing its one GPU on a ``cuda`` run: a Ray instance of its own
    (``address="local"``), even where a cluster runs on this machine, which Ray would otherwise join (and then
    refuse the core count it was given). With it, Ray joins that
    cluster and every client takes ``client_cpus`` and ``client_gpus`` (on a ``cuda`` run by default
    ``1 / workers_per_gpu`` of a GPU), so Flower runs as many at once as the cluster's nodes hold.
    """
    logging_args = {"log_to_driver": verbose, "logging_level": logging.INFO if verbose else logging.ERROR}
    if engine.ray_address is not None:
        gpus = engine.client_gpus if engine.client_gpus is not None else (1.0 / engine.workers_per_gpu if cuda else 0.0)
        return {
            "client_resources": {"num_cpus": engine.client_cpus, "num_gpus": gpus},
            "init_args": {"address": engine.ray_address, **logging_args},
        }
    cores = os.cpu_count() or 1
    parallel = max(1, min(max(1, engine.num_supernodes), int(cores // engine.client_cpus)))
    gpus = engine.client_gpus if engine.client_gpus is not None else (1.0 / parallel if cuda else 0.0)
    return {
        "client_resources": {"num_cpus": engine.client_cpus, "num_gpus": gpus},
        "init_args": {
            "address": "local",
            "num_cpus": max(1, round(parallel * engine.client_cpus)),
            "num_gpus": 1 if gpus else 0,
            "include_dashboard": False,
            **logging_args,
        },
    }


RAY_PROBE_SECONDS = 5.0
"""How long a ``host:port`` in ``engine.ray_address`` may take to accept a connection before the run is refused
(Ray itself retries an unreachable address for minutes before it gives up)."""


def check_ray_address(address: str | None) -> None:
    """Refuse, in one sentence, an ``engine.ray_address`` of the form ``host:port`` (or ``ray://host:port``) whose
    port accepts no connection within :data:`RAY_PROBE_SECONDS`; ``auto`` and ``local`` are Ray's to resolve."""
    if address is None or address in ("auto", "local"):
        return
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return  # not host:port: Ray reads it (and says what is wrong with it)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_PROBE_SECONDS):
            pass
    except OSError as err:
        raise UserError(
            f"No Ray cluster answers at engine.ray_address={address!r} ({err.strerror or err}); start it there "
            "(`ray start --head --port PORT`) or leave engine.ray_address unset to simulate on this machine."
        ) from None


def _connection_error(err: BaseException) -> BaseException | None:
    """The ``ConnectionError`` among ``err``'s causes (Ray's, when it could not join a cluster), if any."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, ConnectionError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def run_flower_simulation(
    cfg: ExperimentConfig,
    out: Path,
    *,
    resume: bool = False,
    force: bool = False,
    progress: Progress | None = None,
    on_interrupt: Callable[[], None] | None = None,
) -> Path:
    """Run an experiment on Flower's simulation engine (Ray, in-process); returns the output directory.

    The ServerApp runs the same :class:`~fedpeft.runner.Experiment` as the local engine, with a
    :class:`GridEngine` over its grid; ``cfg.engine.num_supernodes`` virtual SuperNodes serve the clients, at
    most one per CPU core at a time.

    Ctrl-C stops the round loop and ends Ray's processes; ``on_interrupt`` (the CLI's) is called first, with
    Ray still up, to say what it must before they end: once Ray's processes are gone, a Ray call from any of
    the simulation's threads may end this process at once with exit code 1 (Ray's driver exits when its local
    Raylet is dead).
    """
    if importlib.util.find_spec("ray") is None:
        raise UserError("The flower engine simulates with Ray; install it with `pip install 'flwr[simulation]'`.")
    from flwr.simulation import run_simulation

    cfg = flower_config(cfg)
    progress = progress or Progress()
    experiment = Experiment(cfg, out, progress)  # validates the methods before anything starts
    experiment.check_output(resume=resume, force=force)  # the output directory too, before Ray starts
    failures: list[BaseException] = []
    stop = threading.Event()
    methods_at_once = cfg.engine.concurrent_methods
    concurrent = 1 if cfg.engine.secagg is not None or methods_at_once is None else methods_at_once + 1

    def main(grid: Grid, context: Context) -> None:
        try:
            experiment.run(
                resume=resume,
                force=force,
                engine_factory=lambda worker: GridEngine(
                    grid,
                    worker,
                    on_client=progress.advance_client,
                    stop=stop,
                    concurrent_units=concurrent,
                    node_timeout=SIMULATION_NODE_TIMEOUT,
                ),
            )
        except BaseException as err:  # re-raised below, in the caller's thread, as it is
            failures.append(err)

    server_app = ServerApp()
    server_app.main()(main)
    nodes = max(1, cfg.engine.num_supernodes)
    from fedpeft.models.runtime import resolve_device

    verbose = log.isEnabledFor(logging.INFO)
    backend_config = simulation_backend(cfg.engine, resolve_device(cfg.device).startswith("cuda"), verbose=verbose)
    if not verbose:  # importing flwr resets its logger to DEBUG
        logging.getLogger("flwr").setLevel(logging.ERROR)

    def interrupt(signum: int, frame: object) -> None:
        """Ctrl-C: stop the server's round loop where it stands (a round in flight is dropped, never aggregated
        or checkpointed), end Ray's processes and the ClientApps at once, and interrupt the caller. The
        checkpoints are atomic, so the run continues with ``--resume``; whoever handles the interrupt ends the
        process without waiting for the server thread (the CLI does)."""
        stop.set()
        logging.getLogger("flwr").setLevel(logging.CRITICAL)  # the ended backend's errors are expected
        if on_interrupt is not None:
            on_interrupt()
        end_descendants()
        raise KeyboardInterrupt

    check_ray_address(cfg.engine.ray_address)
    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Tip: In future versions of Ray", category=FutureWarning)
            run_simulation(
                server_app=server_app, client_app=client_app, num_supernodes=nodes, backend_config=backend_config
            )
    except Exception as err:
        # The simulation's runtime failed (Ray did not start or join): its ServerApp thread would wait for the
        # virtual nodes' answers until SIMULATION_NODE_TIMEOUT; it stops at its next exchange instead.
        stop.set()
        unreachable = _connection_error(err)
        if unreachable is not None and cfg.engine.ray_address is not None:
            raise UserError(
                f"Ray could not join the cluster at engine.ray_address={cfg.engine.ray_address!r} ({unreachable}); "
                "start it (`ray start --head`) or leave engine.ray_address unset to simulate on this machine."
            ) from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)
    if failures:
        raise failures[0]
    if not (Path(out) / "results.jsonl").exists():
        raise RuntimeError("The Flower simulation ended before the experiment wrote its outputs; see the log above.")
    return Path(out)
