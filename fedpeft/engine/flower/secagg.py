"""Secure aggregation of a round with Flower's SecAgg+ protocol: the server learns only the sum.

For a method whose server step is the weighted mean of the uploads, one round runs as Flower's
``SecAggPlusWorkflow`` (server) and ``secaggplus_mod`` (each node) run it:

- the server sends every node that serves sampled clients one request (its clients and their payloads), riding in
  the protocol's fit instructions;
- each node trains its clients, checks every update as the server would (:mod:`fedpeft.engine.validation`: the
  server cannot, it never sees one), and uploads the weighted mean of its valid updates with their total number of
  examples as the weight; the mod quantizes that vector, masks it with pairwise and private masks agreed with the
  other nodes, and sends only the masked vector;
- the server adds the masked vectors; the masks cancel (those of nodes that dropped out after the key exchange are
  rebuilt from the other nodes' secret shares, while at least ``reconstruction_threshold`` remain), leaving the
  weighted sum, which it divides by the total weight: the weighted mean of every valid update, as the method's
  aggregation would compute it, up to the quantization error (``2 * clipping_range / quantization_range`` per
  coordinate and node).

What the server still learns: which clients each node trained, whether each failed or was rejected and why,
their training metrics, and each node's total number of examples (the weight of its masked vector). A node is
the unit of privacy: several clients on one node are summed in the clear on that node.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypedDict, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.serverapp import Grid

from fedpeft.core.config import SecAggConfig
from fedpeft.core.faults import ClientDroppedError
from fedpeft.core.types import ClientUpdate, Payload
from fedpeft.engine.flower.codec import ClientTaskError, ErrorDetails, client_error, decode, encode, error_details
from fedpeft.engine.flower.messages import ARRAYS_KEY, CONFIG_KEY
from fedpeft.engine.rounds import ClientOutcome
from fedpeft.engine.validation import UpdateChecks, UpdateRejectedError

if TYPE_CHECKING:
    from flwr.common import FitIns
    from flwr.server.strategy import Strategy

    from fedpeft.worker import Worker

log = logging.getLogger("fedpeft")

_REQUEST = "fedpeft.secure.request"  # FitIns config: the node's request (JSON of the encoded request)
_KEYS = "fedpeft.secure.keys"  # FitIns config: the names of the request's arrays, in the parameters' order
_REPORT = "fedpeft.secure.report"  # FitRes metrics: what became of each client on the node (JSON)
_FIT_CONFIG = "fitins.config"  # where the legacy fit instructions keep their config in a message


def is_secure_request(content: RecordDict) -> bool:
    """Whether a ``train`` message carries a SecAgg+ round's fit instructions (not a plain client task)."""
    return _FIT_CONFIG in content.config_records and _REQUEST in content.config_records[_FIT_CONFIG]


# ---------------------------------------------------------------------------------------------- server
class RoundHost(Protocol):
    """What a secure round needs of its engine (:class:`~fedpeft.engine.flower.grid.GridEngine`)."""

    grid: Grid
    run_dir: str
    config_text: str

    def node_of(self, client_id: str) -> int | None:
        """The node that serves ``client_id`` (None while its node is lost)."""

    def worker_sizes(self) -> dict[str, int]:
        """The training-set size of every client the server knows."""

    def spec_of(self, label: str, payload: Payload) -> dict[str, torch.Size]:
        """The keys and shapes method ``label`` expects back for ``payload`` (the layout of a secure sum)."""


class ClientReport(ErrorDetails, total=False):
    """What a node reports of one client of a secure round: ``status`` ``ok`` (with its ``weight``, ``metrics`` and
    the injected ``fault`` that struck it, if any), ``dropped``, ``failed`` or ``rejected`` (with the ``reason``);
    and the ``seconds`` its work took."""

    client: str
    status: str
    reason: str
    weight: float
    metrics: dict[str, float]
    fault: str | None
    seconds: float


class _SecureRequest(TypedDict):
    run_dir: str
    config_text: str
    label: str
    seed: int
    round_: int
    payloads: dict[str, Payload]


@dataclass
class _Round:
    """What the server's strategy hands the workflow, and what it gets back."""

    requests: dict[int, FitIns]  # by node
    aggregate: list[np.ndarray] | None = None
    reports: list[ClientReport] = field(default_factory=list)
    answered: set[int] = field(default_factory=set)


def _strategy(round_state: _Round) -> Callable[[Grid], Strategy]:
    """A one-round Flower strategy: it picks the nodes of the round and keeps the securely aggregated vector."""
    from flwr.common import FitRes, Parameters, parameters_to_ndarrays
    from flwr.server.client_manager import ClientManager
    from flwr.server.client_proxy import ClientProxy
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.strategy import Strategy

    class OneRound(Strategy):
        def __init__(self, grid: Grid) -> None:
            self.grid = grid

        def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
            return None

        def configure_fit(
            self, server_round: int, parameters: Parameters, client_manager: ClientManager
        ) -> list[tuple[ClientProxy, FitIns]]:
            return [(GridClientProxy(node, self.grid, 0), ins) for node, ins in round_state.requests.items()]

        def aggregate_fit(
            self,
            server_round: int,
            results: list[tuple[ClientProxy, FitRes]],
            failures: list[tuple[ClientProxy, FitRes] | BaseException],
        ) -> tuple[Parameters | None, dict]:
            for proxy, res in results:
                round_state.answered.add(int(proxy.node_id))
                round_state.reports += json.loads(str(res.metrics[_REPORT]))
            if results:
                round_state.aggregate = parameters_to_ndarrays(results[0][1].parameters)
            return None, {}

        def configure_evaluate(self, server_round: int, parameters: Parameters, client_manager: ClientManager) -> list:
            return []

        def aggregate_evaluate(self, server_round: int, results: list, failures: list) -> tuple[None, dict]:
            return None, {}

        def evaluate(self, server_round: int, parameters: Parameters) -> None:
            return None

    return OneRound


def secure_round(
    engine: RoundHost,
    settings: SecAggConfig,
    label: str,
    seed: int,
    round_: int,
    client_ids: list[str],
    payload_of: Callable[[str], Payload],
) -> Iterator[ClientOutcome]:
    """One round of ``client_ids`` under SecAgg+: yields the failed, dropped and rejected clients (each as its
    error) and then one update, the weighted mean of the valid ones, whose outcome's ``sum_of`` lists them."""
    from flwr.common import FitIns, ndarrays_to_parameters
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    by_node: dict[int, list[str]] = {}
    for client_id in client_ids:
        node = engine.node_of(client_id)
        if node is not None:  # a client of a lost node has no report: it counts as dropped out
            by_node.setdefault(node, []).append(client_id)
    payloads = {client_id: payload_of(client_id) for client_id in client_ids}
    if len(by_node) < 2:
        reason = (
            f"secure aggregation needs the round's clients on at least 2 nodes, and round {round_ + 1} has them on "
            f"{len(by_node)}; sample more clients or start more nodes"
        )
        for client_id in client_ids:
            yield ClientOutcome(client_id, ClientTaskError(reason))
        return
    requests = {}
    for node, clients in by_node.items():
        request = encode(
            {
                "run_dir": engine.run_dir,
                "config_text": engine.config_text,
                "label": label,
                "seed": seed,
                "round_": round_,
                "payloads": {c: payloads[c] for c in clients},
            }
        )
        arrays = request.array_records[ARRAYS_KEY]
        parameters = ndarrays_to_parameters([arrays[key].numpy() for key in arrays])
        config: dict[str, bool | bytes | float | int | str] = {
            _REQUEST: str(request.config_records[CONFIG_KEY]["json"]),
            _KEYS: json.dumps(list(arrays)),
        }
        requests[node] = FitIns(parameters, config)
    state = _Round(requests)
    sizes = engine.worker_sizes()
    context = LegacyContext(
        Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
        strategy=_strategy(state)(engine.grid),
    )
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: round_ + 1})
    context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    workflow = SecAggPlusWorkflow(
        settings.num_shares,
        settings.reconstruction_threshold,
        max_weight=float(sum(sizes.get(c, 0) for c in client_ids) or 1),
        clipping_range=settings.clipping_range,
        quantization_range=settings.quantization_range,
        modulus_range=settings.modulus_range,
        timeout=settings.timeout,
    )
    started = time.perf_counter()
    workflow(engine.grid, context)
    seconds = time.perf_counter() - started
    reported = {r["client"]: r for r in state.reports}
    contributors = []
    for client_id in client_ids:
        report = reported.get(client_id)
        if report is None and state.aggregate is not None:
            yield ClientOutcome(client_id, ClientDroppedError("its node dropped out of the secure aggregation"))
        elif report is None:
            why = "secure aggregation halted: too few nodes answered to remove the masks"
            yield ClientOutcome(client_id, ClientTaskError(why))
        elif report["status"] in ("dropped", "failed"):
            error = client_error(report["reason"], report, dropped=report["status"] == "dropped")
            yield ClientOutcome(client_id, error)
        elif report["status"] == "rejected":
            yield ClientOutcome(client_id, UpdateRejectedError(report["reason"]))
        else:
            contributors.append(client_id)
    if not contributors or state.aggregate is None:
        for client_id in contributors:
            yield ClientOutcome(client_id, ClientTaskError("secure aggregation halted before the sum was known"))
        return
    first = payloads[contributors[0]]
    spec = engine.spec_of(label, first)
    tensors = {
        key: torch.from_numpy(np.asarray(array)).reshape(tuple(shape)).to(first.tensors[key].dtype)
        if key in first.tensors
        else torch.from_numpy(np.asarray(array)).reshape(tuple(shape))
        for (key, shape), array in zip(spec.items(), state.aggregate, strict=True)
    }
    weight = float(sum(reported[c]["weight"] for c in contributors))
    metrics: dict[str, float] = {}
    for client_id in contributors:
        for key, value in reported[client_id]["metrics"].items():
            metrics[key] = metrics.get(key, 0.0) + float(value) / len(contributors)
    faults = {c: fault for c in contributors if (fault := reported[c].get("fault"))}
    seconds_of = {c: reported[c]["seconds"] for c in contributors}
    log.info("round %d: secure aggregation of %d clients took %.2f s", round_ + 1, len(contributors), seconds)
    update = ClientUpdate(contributors[0], tensors, weight, metrics)
    yield ClientOutcome(contributors[0], update, seconds, faults, sum_of=seconds_of)


# ---------------------------------------------------------------------------------------------- node
def _request_of(content: RecordDict) -> _SecureRequest:
    from flwr.compat.common import recorddict_compat as compat

    fitins = compat.recorddict_to_fitins(content, keep_input=True)
    keys = json.loads(str(fitins.config[_KEYS]))
    arrays = compat.parameters_to_arrayrecord(fitins.parameters, keep_input=True)
    record = ArrayRecord(dict(zip(keys, arrays.values(), strict=True)))
    text = str(fitins.config[_REQUEST])
    return cast(_SecureRequest, decode(RecordDict({ARRAYS_KEY: record, CONFIG_KEY: ConfigRecord({"json": text})})))


def handle_secure_train(content: RecordDict, worker_of: Callable[[str, str], Worker]) -> RecordDict:
    """Train every client of this node's request, check each update, and answer with the weighted mean of the
    valid ones as a legacy fit result (which ``secaggplus_mod`` masks before it leaves the node)."""
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.compat.common import recorddict_compat as compat

    request = _request_of(content)
    worker = worker_of(request["run_dir"], request["config_text"])
    method = worker.methods[request["label"]]
    sizes = {c.client_id: len(c.train) for c in worker.data.clients}
    checks = UpdateChecks(sizes, worker.cfg.validation.max_norm)
    payloads: dict[str, Payload] = request["payloads"]
    spec = method.update_spec(next(iter(payloads.values())))
    if spec is None:
        raise ValueError(f"{method.name} declares no update shapes, which secure aggregation needs")
    sums = {key: torch.zeros(tuple(shape), dtype=torch.float64) for key, shape in spec.items()}
    total = 0.0
    reports = []
    for client_id, payload in payloads.items():
        started = time.perf_counter()
        report: ClientReport = {"client": client_id, "status": "ok", "metrics": {}}
        try:
            result = worker.train(request["label"], request["seed"], request["round_"], client_id, payload)
        except ClientDroppedError as err:
            report.update({"status": "dropped", "reason": repr(err), **error_details(err)})
        except Exception as err:  # reported to the server, which leaves the client out
            log.warning("client %s failed on this node: %r", client_id, err)
            report.update({"status": "failed", "reason": repr(err), **error_details(err)})
        else:
            update = result.update
            report["fault"] = ",".join(result.faults) or None
            reason = checks.reject_reason(update, payload, method.update_spec(payload))
            if reason is not None:
                report.update({"status": "rejected", "reason": reason})
            else:
                for key in sums:
                    sums[key] += update.tensors[key].detach().to(torch.float64) * update.weight
                total += update.weight
                report.update({"weight": update.weight, "metrics": {k: float(v) for k, v in update.metrics.items()}})
        report["seconds"] = time.perf_counter() - started
        reports.append(report)
    if all(r["status"] == "dropped" for r in reports):  # nobody here answers: the node drops out of the protocol
        raise ClientDroppedError(f"every client of this node dropped out of round {request['round_']}")
    arrays = [(v / total if total > 0 else v).numpy() for v in sums.values()]
    fitres = FitRes(
        Status(Code.OK, "secure round"),
        ndarrays_to_parameters(arrays),
        int(round(total)),
        {_REPORT: json.dumps(reports)},
    )
    return compat.fitres_to_recorddict(fitres, keep_input=False)
