"""Site-local data (``data.sites``): what a site tells the server about its clients, and the server's view of the
federation built from every site's answer.

A site (a SuperNode with ``data-path`` in its node config) builds its clients' data from its own directory and
reports, per client, the id, group, pool and the sizes of the training and test sets; the examples never leave
it. The server joins the reports into a :class:`FederatedData` whose examples are
:class:`~fedpeft.data.types.RemoteExamples`: the ids and sizes the round loop needs (sampling, weights, update
checks, summaries), nothing to read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypedDict

from fedpeft.core.config import DataConfig
from fedpeft.core.errors import UserError
from fedpeft.data.files import choose_unseen
from fedpeft.data.real.readers import natural_key
from fedpeft.data.types import ClientData, FederatedData, RemoteExamples, TaskKind

GENERIC_DATASETS = ("files", "hub")
"""Datasets whose unseen pool the server draws over the union of the sites' clients (``choose_unseen``)."""


class SiteClient(TypedDict):
    """One client in a site's report: its id, group and pool, and the sizes of its training and test sets."""

    id: str
    group: str
    pool: str
    train: int
    test: int


class SiteReport(TypedDict):
    """What a site tells the server of its data (:func:`site_report`)."""

    name: str
    task: TaskKind
    label_names: list[str] | None
    groups: list[str]
    clients: list[SiteClient]


class SiteAnswer(SiteReport):
    """A site's answer to the server's site query: its report, and the ``data-path`` it built its clients from."""

    data_path: str


def site_config(cfg: DataConfig, data_path: str) -> DataConfig:
    """The data config a site builds its clients from: the config's, reading ``data_path`` (``hub_id`` for the
    ``hub`` dataset, ``path`` for every other)."""
    field = "hub_id" if cfg.name == "hub" else "path"
    return cfg.model_copy(update={field: data_path})


def node_data_config(cfg: DataConfig, data: FederatedData) -> DataConfig:
    """The data config the server sends its sites: for the generic datasets, the unseen pool it drew over every
    site's clients, by name."""
    if data.name not in GENERIC_DATASETS:
        return cfg
    unseen = [c.client_id for c in data.pool("unseen")]
    return cfg.model_copy(update={"unseen_clients": unseen, "unseen_fraction": 0.0})


def site_report(data: FederatedData) -> SiteReport:
    """What a site tells the server: the task, class names and groups, and per client its id, group, pool and
    the sizes of its training and test sets."""
    return {
        "name": data.name,
        "task": data.task,
        "label_names": data.label_names,
        "groups": list(data.groups),
        "clients": [
            {"id": c.client_id, "group": c.group, "pool": c.pool, "train": len(c.train), "test": len(c.test)}
            for c in data.clients
        ],
    }


def join_sites(cfg: DataConfig, reports: Mapping[int, SiteReport]) -> FederatedData:
    """The server's view of the federation from each node's report (node id -> :func:`site_report`), its clients
    in the order a run over the union of the data has; for the generic datasets the unseen pool is drawn over
    every site's clients (:func:`~fedpeft.data.files.choose_unseen`), so the sites must build theirs from
    :func:`node_data_config`.

    Raises:
        UserError: a client id reported by two nodes, sites that disagree on the task or the class names, or no
            client at all.
    """
    if not reports:
        raise UserError("No site reported any client; start each SuperNode with --node-config \"data-path='DIR'\".")
    first = next(iter(reports.values()))
    owners: dict[str, int] = {}
    clients: list[ClientData] = []
    groups: list[str] = []
    for node, report in sorted(reports.items()):
        for fact in ("task", "label_names"):
            if report[fact] != first[fact]:
                fix = "set data.label_names in the config" if fact == "label_names" else "check data.task"
                raise UserError(
                    f"The sites disagree on the {fact.replace('_', ' ')} ({first[fact]} against {report[fact]} on "
                    f"node {node}); {fix}."
                )
        for entry in report["clients"]:
            client_id = entry["id"]
            if client_id in owners:  # never prefer one: either site may be wrong
                raise UserError(
                    f"Client {client_id!r} is on two sites (SuperNodes {owners[client_id]} and {node}); each client's "
                    "data must live on one site: give the clients distinct ids."
                )
            owners[client_id] = node
            where = f"client {client_id}"
            train, test = RemoteExamples(entry["train"], where), RemoteExamples(entry["test"], where)
            clients.append(ClientData(client_id, entry["group"], entry["pool"], train, test))
        groups += [g for g in report["groups"] if g not in groups]
    if not clients:
        raise UserError("The sites hold no client; check each SuperNode's data-path.")
    if first["name"] in GENERIC_DATASETS:  # the unseen pool, drawn over every site's clients as over their union
        unseen = choose_unseen(cfg.model_copy(update={"sites": None}), first["name"], list(owners))
        for client in clients:
            client.pool = "unseen" if client.client_id in unseen else "seen"
        groups = sorted(groups, key=natural_key)
    clients.sort(key=lambda c: (c.pool != "seen", natural_key(c.client_id)))
    info = {
        "source": f"{len(reports)} sites (data-path of each SuperNode)",
        "sites": len(reports),
        "num_clients": len(clients),
        "samples_per_client": {c.client_id: len(c.train) + len(c.test) for c in clients},
    }
    return FederatedData(
        name=first["name"],
        task=first["task"],
        label_names=first["label_names"],
        groups=groups,
        clients=clients,
        base_train=[],
        info=info,
    )
