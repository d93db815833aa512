"""The ``fedpeft`` command line: run, list, plan, report, compare, personalize, adopt, launch, certs."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, Optional

import typer
from rich.console import Console
from rich.markdown import Markdown

from fedpeft.core.errors import AllClientsFailedError, MissingResultsError, UserError
from fedpeft.core.logs import hide_library_progress, ignore_deprecations, quiet_libraries
from fedpeft.core.processes import end_descendants

if TYPE_CHECKING:
    from fedpeft.core.config import ExperimentConfig
    from fedpeft.data.types import FederatedData

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Personalized federated fine-tuning with adapters.")
console = Console()


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"fedpeft {version('fedpeft')}")
        except PackageNotFoundError:  # run from a checkout that is not installed
            typer.echo("fedpeft (not installed)")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Personalized federated fine-tuning with adapters."""


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:  # the libraries' warnings and deprecation notices: shown with -v only
        ignore_deprecations()
        quiet_libraries()


def _quiet_libraries(verbose: bool) -> None:
    """Switch off transformers' and datasets' progress bars and advice (unless ``verbose``); imports both, so a
    command calls it once its input is known to be good."""
    if not verbose:
        hide_library_progress()


@app.command()
def run(
    config: Annotated[str, typer.Argument(help="A preset name (see `fedpeft list presets`) or a YAML file.")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set data.seed=3")] = None,  # noqa: UP045
    out: Annotated[Optional[Path], typer.Option(help="Output directory (default runs/<name>).")] = None,  # noqa: UP045
    engine: Annotated[Optional[str], typer.Option(help="local or flower (overrides engine.name).")] = None,  # noqa: UP045
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from where it stopped.")] = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Write into a non-empty --out that holds no fedpeft run, beside its files."),
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log every stage and round; end with every gain table.")
    ] = False,
    plot_format: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option("--plot-format", help="Plot file formats, comma-separated: png,pdf,svg (output.plot_formats)."),
    ] = None,
    rehearse: Annotated[
        bool,
        typer.Option(
            "--rehearse",
            help="Rehearse the run here: true shapes, stand-in data, random weights, compute cut (rehearse.*; "
            "docs/rehearsal.md). Default --out runs/<name>-rehearsal.",
        ),
    ] = False,
) -> None:
    """Run an experiment and write its outputs (config, results, costs, summary, plots, adapters).

    CONFIG is a preset name (fedpeft list presets) or a YAML file.

    Examples:
      fedpeft run quickstart
      fedpeft run my.yaml --set seeds=[0] --out runs/x
      fedpeft run fedp2eft-xnli --rehearse
    """
    _setup_logging(verbose)
    from fedpeft.core.config import apply_override, load_raw, validate
    from fedpeft.core.figures import parse_formats
    from fedpeft.core.hub import check_raw_model
    from fedpeft.core.io import path_component
    from fedpeft.core.progress import Progress

    overrides = list(set_ or [])
    if plot_format is not None:
        overrides.append(f"output.plot_formats=[{','.join(parse_formats(plot_format))}]")
    if engine is not None:
        if engine not in ("local", "flower"):
            raise UserError(f"Unknown engine {engine!r}; choose local or flower.")
        overrides.append(f"engine.name={engine}")
    raw = load_raw(config)
    if rehearse and not isinstance(raw.get("rehearse"), dict):
        raw["rehearse"] = {}
    for assignment in overrides:
        apply_override(raw, assignment)
    rehearsal = raw.get("rehearse") is not None
    suffix = "-rehearsal" if rehearsal else ""
    if not resume and (out is not None or isinstance(raw.get("name"), str)):
        from fedpeft.rundir import refuse_existing_run

        refuse_existing_run(out or Path("runs") / (path_component(raw["name"]) + suffix))  # before torch is imported
    if not rehearsal:  # a rehearsal loads no weights: its models stand in for themselves
        check_raw_model(raw)  # a model nothing could load without the hub ends here, before torch is imported
    cfg = validate(raw)  # and so does a misspelt method or dataset name
    data = _read_data_early(cfg)  # and so does every problem with the data, a user's own or a benchmark's
    _quiet_libraries(verbose)
    notes: list[str] = []
    step_batch, step_lengths = 0, {}
    started = time.perf_counter()
    if cfg.rehearse is not None:
        from fedpeft.rehearsal.driver import prepare
        from fedpeft.rehearsal.steps import first_batch

        step_batch = first_batch(cfg)  # the step is measured at the uncut batch and lengths
        step_lengths = {key: m.max_length for key, m in (cfg.models or {"": cfg.model}).items()}
        cfg, notes = prepare(cfg)
    from fedpeft.runner import Experiment

    target = out or Path("runs") / (path_component(cfg.name) + suffix)  # the name is one directory below runs/
    terminal = sys.stderr.isatty()
    with Progress(enabled=terminal, plain=not terminal) as progress:
        if cfg.engine.name == "flower":
            from fedpeft.apps.flower import run_flower_simulation

            def interrupted() -> None:
                progress.__exit__(None, None, None)
                _end_simulation(130, "interrupted")

            run_flower_simulation(cfg, target, resume=resume, force=force, progress=progress, on_interrupt=interrupted)
        else:
            Experiment(cfg, target, progress=progress, data=data).run(resume=resume, force=force)
    if cfg.rehearse is not None:
        from fedpeft.rehearsal.driver import summarize, summary_lines
        from fedpeft.rehearsal.steps import first_batch, measure_steps

        steps = (
            measure_steps(
                cfg,
                step_batch,
                check_full_depth=cfg.rehearse.check_full_depth,
                cut_batch=first_batch(cfg),
                lengths=step_lengths,
            )
            if cfg.rehearse.measure_steps
            else []
        )
        for line in summary_lines(summarize(target, cfg, notes, steps, time.perf_counter() - started)):
            typer.echo(line)
    else:
        from fedpeft.report.terminal import run_end_block

        for line in run_end_block(target, every_table=verbose):
            typer.echo(line)
    console.print(f"Outputs written to [bold]{target}[/bold]", soft_wrap=True)


def _read_data_early(cfg: ExperimentConfig) -> FederatedData | None:
    """The federation of a user's own data (``data.name`` ``files`` or ``hub``), built before torch is imported, so
    that a missing file, a label outside ``data.label_names`` or a client without examples ends the run within a
    second or two; the local engine's run takes it as read. ``hub`` data is first checked from its metadata, without
    ``datasets`` (:mod:`fedpeft.data.hub_check`): a hub id or directory that names nothing readable, a missing
    column or more clients than rows ends the run within a second. A real benchmark's data is checked the same way
    (:mod:`fedpeft.data.real.early`: its folders, files, columns and cached copy) and built by the run, unless a
    rehearsal stands in for it. ``None`` for every dataset but ``files`` and ``hub``, and for data on the sites of a
    deployment."""
    if cfg.data.sites is not None:
        return None
    if cfg.data.name not in ("files", "hub"):
        if cfg.rehearse is None or _real_data_here(cfg):
            from fedpeft.data.real.early import check_real_data

            check_real_data(cfg.data)
        return None
    from fedpeft.data.files import build_files, build_hub

    if cfg.data.name == "files":
        return build_files(cfg.data)
    from fedpeft.data.hub_check import check_hub_data

    check_hub_data(cfg.data)
    return build_hub(cfg.data)


def _real_data_here(cfg: ExperimentConfig) -> bool:
    """Whether a rehearsal reads ``cfg``'s real data (it writes a stand-in for data not on this machine)."""
    from fedpeft.rehearsal.standin_data import real_data_available

    return real_data_available(cfg)


@app.command("list")
def list_(
    what: Annotated[str, typer.Argument(help="methods, datasets, models or presets")],
) -> None:
    """Print what is registered, one name and its one-line description per line (imports no method or model)."""
    from fedpeft.core.registry import DATASETS, METHODS, MODELS

    registries = {"methods": METHODS, "datasets": DATASETS, "models": MODELS}
    if what == "presets":
        from fedpeft.core.config import preset_description, preset_names  # pydantic: only when needed

        rows = [(name, preset_description(name)) for name in preset_names()]
    elif what in registries:
        registry = registries[what]
        rows = []
        for name in registry.names():
            aliases = registry.aliases_of(name)
            alias = f" (alias: {', '.join(aliases)})" if aliases else ""
            rows.append((name, registry.describe(name) + alias))
    else:
        raise UserError(f"Cannot list {what!r}; choose methods, datasets, models or presets.")
    width = max((len(name) for name, _ in rows), default=0)
    for name, description in rows:
        typer.echo(f"{name:<{width}}  {description}".rstrip())


@app.command()
def plan(
    config: Annotated[str, typer.Argument(help="A preset name (see `fedpeft list presets`) or a YAML file.")],
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set data.seed=3")] = None,  # noqa: UP045
    json_: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    gpu: Annotated[
        str, typer.Option("--gpu", help="The GPU to time it on: H100, A100-40GB, A100-80GB, L4, ...")
    ] = "H100",
    gpus: Annotated[int, typer.Option("--gpus", help="How many of them run clients at once.")] = 1,
    measure_cpu: Annotated[
        bool, typer.Option("--measure-cpu/--no-measure-cpu", help="Time this CPU with one quick matmul.")
    ] = True,
    rehearsal: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(
            "--rehearsal",
            help="A rehearsal of this config (its run directory) whose measured step times this CPU (default: "
            "runs/<name>-rehearsal when it holds one; docs/rehearsal.md).",
        ),
    ] = None,
) -> None:
    """What a run costs before it runs: per phase its trainings, tokens, FLOPs, memory, disk, traffic and hours
    (computed, not measured; docs/plan.md). Imports no torch.

    Examples:
      fedpeft plan fedp2eft-xnli
      fedpeft plan my.yaml --gpu A100-40GB --gpus 8 --json
    """
    import json

    from fedpeft.core.config import load_config
    from fedpeft.planning.devices import GPUS, measure_cpu_flops
    from fedpeft.planning.devices import gpu as gpu_named
    from fedpeft.planning.plan import make_plan
    from fedpeft.planning.render import plan_json, plan_lines, plan_tables

    device = gpu_named(gpu)
    if device is None:
        raise UserError(f"Unknown GPU {gpu!r}; choose one of {', '.join(g.name for g in GPUS.values())}.")
    if gpus < 1:
        raise UserError("--gpus must be 1 or more.")
    cfg = load_config(config, list(set_ or []))
    data = plan_json(make_plan(cfg), device, gpus, measure_cpu_flops() if measure_cpu else None)
    from fedpeft.core.io import path_component
    from fedpeft.planning.rehearsed import read_rehearsal, rehearsed_cpu, rehearsed_lines

    if rehearsal is not None and not rehearsal.exists():
        raise UserError(f"--rehearsal {rehearsal} does not exist; give the run directory of a rehearsal.")
    measured = read_rehearsal(rehearsal or Path("runs") / f"{path_component(cfg.name)}-rehearsal")
    if rehearsal is not None and measured is None:
        raise UserError(
            f"{rehearsal} holds no rehearsal with a measured step; run `fedpeft run {config} --rehearse` into it."
        )
    if measured is not None:
        data["rehearsed"] = rehearsed_cpu(data, measured)
    if json_:
        typer.echo(json.dumps(data, indent=2))
        return
    for table in plan_tables(data, width=console.width):
        console.print(table)
    for line in plan_lines(data) + (rehearsed_lines(data["rehearsed"]) if "rehearsed" in data else []):
        console.print(line, soft_wrap=True, markup=False)


@app.command()
def report(
    runs: Annotated[list[Path], typer.Argument(help="Run directories to merge into one summary.")],
    out: Annotated[Path, typer.Option(help="Where to write the merged summary.md and plots.")] = Path("report"),
    force: Annotated[
        bool,
        typer.Option("--force", help="Write beside the files of a non-empty --out not written by `fedpeft report`."),
    ] = False,
    plot_format: Annotated[
        str, typer.Option("--plot-format", help="Plot file formats, comma-separated: png,pdf,svg.")
    ] = "png",
    csv: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--csv", help="Also write the result tables as one tidy CSV: a .csv file or a directory."),
    ] = None,
    latex: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--latex", help="Also write the result tables as LaTeX (booktabs): a .tex file or a directory."),
    ] = None,
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="Draw the plots (most of a report's time) or only summary.md.")
    ] = True,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Print the whole summary, not only its headline and gain tables.")
    ] = False,
) -> None:
    """Merge the results of several runs into one summary (and plots; with --csv, --latex, the tables as files).

    It ends as `fedpeft run` does: the summary's headline and gain over base, then where the outputs are; with -v,
    the whole summary instead.
    """
    _setup_logging(False)
    from fedpeft import report as reporting
    from fedpeft.core.figures import parse_formats
    from fedpeft.core.io import REPORT_MARKER, check_output_dir, make_output_dir
    from fedpeft.report.export import is_table_file, table_file
    from fedpeft.report.terminal import fit_tables, run_end_block
    from fedpeft.rundir import check_output_file, refuse_run_files

    formats = parse_formats(plot_format)  # a bad format fails before anything is written
    for run_dir in runs:
        if not (run_dir / "results.jsonl").is_file():
            raise UserError(f"{run_dir} holds no results.jsonl; pass directories written by `fedpeft run`.")
    # Besides its own directories, a report may rebuild the summary and plots of the one run it reads.
    given = {run_dir.resolve() for run_dir in runs}
    refuse_run_files(out, "--out", run=next(iter(given)) if len(given) == 1 else None)
    for option, path, suffix in (("--csv", csv, ".csv"), ("--latex", latex, ".tex")):
        if path is not None:
            check_output_file(table_file(path, suffix), option, "report", is_table_file)
    check_output_dir(
        out,
        "report",
        REPORT_MARKER,
        writes=(REPORT_MARKER, "summary.md", "clients.csv", "plots"),
        force=force,
        accepted=lambda path: path.resolve() in given,
    )
    created = out.resolve() not in given and make_output_dir(out, REPORT_MARKER, "report")
    try:
        text = reporting.write_summary(runs, out / "summary.md")
        if plots:
            reporting.write_plots(runs, out / "plots", formats=formats)
    except BaseException:
        if created:  # a report that could not be made leaves no directory it created behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    tables = []
    if csv is not None:
        tables.append(reporting.write_csv(runs, csv))
    if latex is not None:
        tables.append(reporting.write_latex(runs, latex))
    if verbose:
        console.print(Markdown(fit_tables(text, console.width)))
    else:
        for line in run_end_block(out):
            typer.echo(line)
    for target in tables:
        console.print(f"Tables written to [bold]{target}[/bold]", soft_wrap=True)
    console.print(f"Outputs written to [bold]{out}[/bold]", soft_wrap=True)


@app.command()
def compare(
    reference: Annotated[Path, typer.Argument(help="The reference run: a run directory or its results.jsonl(.gz).")],
    rerun: Annotated[Path, typer.Argument(help="The same config run again (another machine, engine or commit).")],
    out: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--out", help="Also write the comparison to this markdown file."),
    ] = None,
    every_pair: Annotated[
        bool, typer.Option("--every-pair", help="List every paired difference, not only those whose verdict changed.")
    ] = False,
) -> None:
    """Compare a rerun with its reference run: how far the records moved and which supported differences hold."""
    _setup_logging(False)
    from fedpeft.core.io import write_text_atomic
    from fedpeft.report.reproduction import COMPARISON_HEADING, compare_runs
    from fedpeft.report.terminal import fit_tables
    from fedpeft.rundir import check_output_file

    if out is not None:  # a comparison it wrote before, or a new file: never a run's file nor a user's
        check_output_file(out, "--out", "compare", lambda first_line: first_line == COMPARISON_HEADING)
    text = compare_runs(reference, rerun, every_pair=every_pair)
    if out is not None:
        write_text_atomic(out, text)
    console.print(Markdown(fit_tables(text, console.width)))


@app.command()
def personalize(
    run_dir: Annotated[Path, typer.Argument(help="A run directory with a trained FedP2EFT PSG (psg/).")],
    budget: Annotated[int, typer.Option("--budget", "-r", help="Rank budget r (average LoRA rank per module).")],
    out: Annotated[Path, typer.Option(help="Directory that receives the PEFT adapter.")],
    data: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option(help="The client's training examples: JSONL or CSV with text[, text_pair], label."),
    ] = None,
    client: Annotated[Optional[str], typer.Option(help="A client id of the run's dataset instead of --data.")] = None,  # noqa: UP045
    method: Annotated[Optional[str], typer.Option(help="The fedp2eft method label (if the run has several).")] = None,  # noqa: UP045
    seed: Annotated[Optional[int], typer.Option(help="Which seed's PSG (default: the first).")] = None,  # noqa: UP045
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Write beside the files of a non-empty --out not written by `fedpeft personalize`."
        ),
    ] = False,
    encoding: Annotated[
        str, typer.Option(help="The encoding of the --data file (e.g. latin-1, cp1252, utf-16); default UTF-8.")
    ] = "utf-8",
    architecture: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="With --data in a run of several architectures: the one to personalize (a `models` key)."),
    ] = None,
) -> None:
    """Write one client's personalized LoRA (FedP2EFT rank structure for budget r) in PEFT format."""
    _setup_logging(False)
    _quiet_libraries(False)
    from fedpeft.personalize import personalize_client

    result = personalize_client(
        run_dir,
        budget,
        out,
        data_file=data,
        client_id=client,
        method=method,
        seed=seed,
        force=force,
        encoding=encoding,
        architecture=architecture,
    )
    kept = ", ".join(f"{name} {rank}" for name, rank in result.ranks.items())
    console.print(f"Client {result.client}, r = {result.budget}: {len(result.ranks)} LoRA modules ({kept}).")
    if result.ranks:
        total = sum(result.ranks.values())
        console.print(
            f"r is the mean rank over the modules, not each module's rank: these {len(result.ranks)} sum to {total} "
            f"({total / len(result.ranks):.3g} per module).",
            soft_wrap=True,
        )
    if result.accuracy is not None:
        console.print(f"Test accuracy: {result.accuracy:.4f}")
    console.print(f"Adapter written to [bold]{result.path}[/bold] (load it with PeftModel.from_pretrained).")


@app.command()
def adopt(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by a fedpeft version without markers.")],
) -> None:
    """Mark a run of an earlier fedpeft version as a run (its .fedpeft-run marker), so that --resume and report
    take it; writes nothing else."""
    from fedpeft.rundir import adopt_run

    if adopt_run(run_dir):
        typer.echo(f"{run_dir} is marked as a fedpeft run; `fedpeft run CONFIG --out {run_dir} --resume` continues it.")
    else:
        typer.echo(f"{run_dir} is a fedpeft run already; nothing to do.")


@app.command()
def launch(
    config: Annotated[str, typer.Argument(help="A preset name or a YAML file (read on the SuperLink's machine).")],
    federation: Annotated[str, typer.Option(help="The SuperLink connection in Flower's config.toml.")],
    out: Annotated[Optional[Path], typer.Option(help="Output directory on the SuperLink's machine.")] = None,  # noqa: UP045
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a key: --set seeds=[0,1].")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out.")] = False,
    node_timeout: Annotated[float, typer.Option(help="Seconds to wait for SuperNodes.")] = 120.0,
    reply_timeout: Annotated[float, typer.Option(help="Seconds to wait for a node's reply (0: no limit).")] = 0.0,
    app_dir: Annotated[Path, typer.Option("--app", help="The fedpeft checkout `flwr run` packs.")] = Path("."),
) -> None:
    """Run an experiment on a Flower deployment (`flwr run`): its progress lines stream to stderr; exits non-zero
    with one sentence when the run fails, and Ctrl-C stops the run on the SuperLink (docs/flower.md)."""
    from fedpeft.apps.launch import launch as launch_run
    from fedpeft.apps.launch import run_config

    text = run_config(
        config, out, list(set_ or []), resume=resume, node_timeout=node_timeout, reply_timeout=reply_timeout
    )
    code = launch_run(app_dir.resolve(), federation, text)
    if code:
        raise typer.Exit(code)


@app.command()
def certs(
    directory: Annotated[Path, typer.Argument(help="Where to write the files.")],
    host: Annotated[
        list[str], typer.Option("--host", help="A name or IP address of the SuperLink (repeat for several).")
    ],
    nodes: Annotated[int, typer.Option(help="SuperNode key pairs to write (node-1, node-1.pub, ...).")] = 0,
) -> None:
    """Write a CA, the SuperLink's TLS certificate and SuperNode keys for a secure deployment (docs/flower.md)."""
    from fedpeft.apps.certs import make_certificates, make_node_key

    if nodes < 0:
        raise UserError("--nodes must be 0 or more.")
    if any((directory / name).exists() for name in ("ca.key", "server.key")):
        raise UserError(f"{directory} already holds keys; choose an empty directory (nothing was overwritten).")
    make_certificates(directory, host)
    for i in range(1, nodes + 1):
        make_node_key(directory / f"node-{i}")
    console.print(f"CA, SuperLink certificate and {nodes} SuperNode key pair(s) written to [bold]{directory}[/bold].")


class Terminated(BaseException):
    """SIGTERM arrived (a BaseException, so that no ``except Exception`` around a client's work swallows it)."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def resume_command(args: list[str]) -> str | None:
    """The shell command that continues the ``fedpeft`` command given ``args`` (``sys.argv[1:]``), each argument
    quoted for a POSIX shell so that the line pastes as it is; ``None`` for a command other than ``run``."""
    if args[:1] != ["run"]:
        return None
    return shlex.join(["fedpeft", *args, *([] if "--resume" in args else ["--resume"])])


def _say_stopped(how: str) -> None:
    """The one line of a stopped command; for ``run``, how to continue."""
    again = resume_command(sys.argv[1:])
    hint = f"; continue it with `{again}`" if again else ""
    print(f"{how}{hint}.", file=sys.stderr)


def _end_simulation(code: int, how: str) -> NoReturn:
    """End a Flower simulation's process: the line first, while Ray still runs, then Ray's processes, then this
    one at once (a Ray driver whose Raylet is gone exits with code 1 at its next Ray call, from any thread)."""
    _say_stopped(how)
    sys.stdout.flush()
    sys.stderr.flush()
    end_descendants(grace=0.0)
    os._exit(code)


def _stopped(code: int, how: str) -> None:
    """End with ``code`` and one line; for ``run``, how to continue."""
    _say_stopped(how)
    # A KeyboardInterrupt that arrived while a string was being exec'd or eval'd (by any library) leaves CPython's
    # "unhandled Ctrl-C" flag set, caught or not; under `python -m` the interpreter then ends by SIGINT (-2) in
    # place of this code. Every string evaluation clears the flag first: one empty one does.
    exec("", {})
    busy = [t for t in threading.enumerate() if t.is_alive() and not t.daemon and t is not threading.main_thread()]
    if busy:  # a thread left blocked (a Flower simulation's server) would keep the process from ending
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def main() -> None:
    """Console entry point: user errors become one sentence and exit code 2; Ctrl-C exits 130 and SIGTERM 143,
    each with one line that says how to resume."""
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = app(standalone_mode=False)  # typer returns 130 itself when Ctrl-C interrupts a command
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except AllClientsFailedError as err:  # every client of a round failed: what is written so far stays
        print(f"error: the run stopped: {err}", file=sys.stderr)
        sys.exit(1)
    except MissingResultsError as err:  # the outputs are written; some clients have none
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except (typer.Abort, KeyboardInterrupt):
        _stopped(130, "interrupted")
    except Terminated:
        _stopped(143, "terminated")
    except Exception as err:  # click usage errors carry their own exit codes
        import click

        if isinstance(err, click.exceptions.ClickException):
            err.show()
            sys.exit(2)
        if isinstance(err, click.exceptions.Exit):
            sys.exit(err.exit_code)
        raise
    if code == 130:
        _stopped(130, "interrupted")
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
