"""An experiment end to end: base-model stage -> federated methods -> personalization -> evaluation -> outputs.

Work is cut into units (the base stage of a seed, the base row of a seed, one method for one seed). A unit writes
its records to ``parts/`` when it completes, and federated phases checkpoint every round, so ``--resume`` skips
finished units and continues a federated phase from its last completed round. Every random draw derives from
(seed, method, phase, round, client), so a resumed run ends with the numbers of an uninterrupted one.

One module per job: :mod:`~fedpeft.runner.experiment` (the run from its checks to its outputs),
:mod:`~fedpeft.runner.checks` (the refusals before anything is written), :mod:`~fedpeft.runner.engine_settings`
(the engine's settings, resolved once), :mod:`~fedpeft.runner.stages` (the units of every seed, in order),
:mod:`~fedpeft.runner.units` (running and listing units, at once where the engine can),
:mod:`~fedpeft.runner.base_stage` (the base models), :mod:`~fedpeft.runner.base_row` (the base model evaluated),
:mod:`~fedpeft.runner.phases` (federated phases and what each round gives), :mod:`~fedpeft.runner.method_unit`
(one method for one seed), :mod:`~fedpeft.runner.outputs` (the merged records, data overview, summary, plots) and
:mod:`~fedpeft.runner.environment` (what the run started on).
"""

from fedpeft.runner.checks import check_config, check_frozen_base, check_loaded
from fedpeft.runner.engine_settings import estimated_weight_bytes, run_engine_settings
from fedpeft.runner.entries import asynchronous_labels, method_entries
from fedpeft.runner.environment import cpu_description, environment
from fedpeft.runner.experiment import EngineFactory, Experiment
from fedpeft.runner.method_unit import merge_cost_rows
from fedpeft.runner.outputs import check_result_coverage, data_overview
from fedpeft.runner.phases import FederatedPhases, RoundOutputs, communication_rows, train_rows
from fedpeft.runner.stages import Stages
from fedpeft.runner.started import StartedRun, check_clients
from fedpeft.runner.units import ENGINE_PART, Units, UnitWork

__all__ = [
    "ENGINE_PART",
    "EngineFactory",
    "Experiment",
    "FederatedPhases",
    "RoundOutputs",
    "Stages",
    "StartedRun",
    "UnitWork",
    "Units",
    "asynchronous_labels",
    "check_clients",
    "check_config",
    "check_frozen_base",
    "check_loaded",
    "check_result_coverage",
    "communication_rows",
    "cpu_description",
    "data_overview",
    "environment",
    "estimated_weight_bytes",
    "merge_cost_rows",
    "method_entries",
    "run_engine_settings",
    "train_rows",
]
