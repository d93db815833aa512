"""Site-local data (``data.sites``): each SuperNode reads its own clients from its ``data-path``; the server learns
their ids and sizes from the nodes and never reads an example (fedpeft/data/sites.py, GridEngine's sites).

The in-process tests run Flower's messages through ClientApp calls in this process (tests/test_flower.py's
``InProcessGrid``); the loopback test starts a real SuperLink and two SuperNodes, each with its own data
directory. Every run is compared with the local engine over the union of the sites' files, same client ids.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from flwr.app import Context, RecordDict

from fedpeft.apps.flower import run_over_grid
from fedpeft.apps.loopback import LoopbackDeployment
from fedpeft.core.config import DataConfig, ModelConfig, validate
from fedpeft.core.errors import UserError
from fedpeft.data.sites import join_sites, site_report
from fedpeft.data.types import RemoteExamples
from fedpeft.engine.flower import GridEngine, flower_config
from fedpeft.engine.flower.membership import register_sites
from fedpeft.runner import Experiment
from tests.test_flower import (  # noqa: F401
    ATOL,
    REPO,
    InProcessGrid,
    RoundLog,
    launch,
    lose_and_restart,
    read_records,
    task_identity,
)

SITES = {"site-a": ("ana", "bo", "cy"), "site-b": ("dee", "eve")}
WORDS = ("good", "fine", "great", "bad", "poor", "awful")


def site_rows(client: str, c: int) -> list[dict]:
    """Twelve reviews of one client, labels skewed per client."""
    rows = []
    for i in range(12):
        label = "positive" if (i + c) % (c + 2) else "negative"
        word = WORDS[(i % 3) + (0 if label == "positive" else 3)]
        rows.append({"text": f"{client} found it {word} number {i}", "label": label, "client": client})
    return rows


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    """Each site's own JSONL file in a directory of its own, the union of both in a third, and a local model
    checkpoint with its own tokenizer (a tiny BERT saved in the Hugging Face layout)."""
    from fedpeft.models.table import load_model

    root = tmp_path_factory.mktemp("sites")
    paths: dict[str, Path] = {}
    union: list[dict] = []
    index = 0
    for site, clients in SITES.items():
        rows = [row for client in clients for row in site_rows(client, index + clients.index(client))]
        index += len(clients)
        (root / site).mkdir()
        (root / site / "reviews.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths[site] = root / site
        union += rows
    (root / "union").mkdir()
    (root / "union" / "reviews.jsonl").write_text("".join(json.dumps(r) + "\n" for r in union))
    paths["union"] = root / "union"
    texts = [row["text"] for row in union] + ["positive negative"]
    loaded = load_model(
        ModelConfig(name="tiny-bert", vocab_size=200), task="classification", num_labels=2, corpus=lambda: texts
    )
    loaded.model.save_pretrained(root / "model")
    loaded.tokenizer.save_pretrained(root / "model")
    paths["model"] = root / "model"
    return paths


def site_raw(paths: dict[str, Path], **data: object) -> dict:
    """An experiment over the sites' data: FedIT and per-client LoRA from the local checkpoint."""
    return {
        "name": "sites",
        "seeds": [0],
        "data": {"name": "files", "partition": "natural", "label_names": ["negative", "positive"], "sites": 2} | data,
        "model": {"name": str(paths["model"]), "max_length": 16},
        "budgets": [2],
        "methods": [
            {"name": "fedit", "rounds": 2, "fraction": 1.0, "local_steps": 2, "batch_size": 4, "lr": 1e-3, "rank": 2},
            {"name": "lora", "epochs": 1, "batch_size": 4, "lr": 1e-3},
        ],
        "output": {"plots": False},
    }


def union_raw(paths: dict[str, Path], **data: object) -> dict:
    """The same experiment on the local engine over the union of the sites' files."""
    raw = site_raw(paths, **data)
    del raw["data"]["sites"]
    raw["data"]["path"] = str(paths["union"])
    return raw


def site_grid(paths: dict[str, Path], *configs: dict) -> InProcessGrid:
    grid = InProcessGrid(num_nodes=len(configs))
    for context, config in zip(grid.contexts.values(), configs, strict=True):
        context.node_config.clear()
        context.node_config.update(config)
    return grid


def assert_same_records(local: Path, flower: Path) -> None:
    ours, theirs = read_records(local), read_records(flower)
    assert ours.keys() == theirs.keys()
    for key, value in ours.items():
        assert theirs[key] == pytest.approx(value, abs=ATOL), key


# ---------------------------------------------------------------------------------------------- the server's view
def test_the_servers_view_has_every_sites_clients_and_sizes_but_no_example(sites):
    """join_sites over two sites' reports: the ids, groups, pools and sizes of a build over the union, with the
    unseen pool drawn over every client as over the union; reading an example is an error."""
    from fedpeft.core.registry import DATASETS

    reports = {}
    for node, site in enumerate(("site-a", "site-b")):
        cfg = DataConfig(name="files", path=str(sites[site]), partition="natural", sites=2, unseen_fraction=0.4)
        reports[node] = site_report(DATASETS.get("files")(cfg))
    joined = join_sites(DataConfig(name="files", partition="natural", sites=2, unseen_fraction=0.4), reports)
    union = DATASETS.get("files")(
        DataConfig(name="files", path=str(sites["union"]), partition="natural", unseen_fraction=0.4)
    )
    assert [(c.client_id, c.pool, len(c.train), len(c.test)) for c in joined.clients] == [
        (c.client_id, c.pool, len(c.train), len(c.test)) for c in union.clients
    ]
    assert joined.groups == union.groups and joined.label_names == union.label_names
    assert len(joined.pool("unseen")) == 2
    client = joined.clients[0]
    assert isinstance(client.train, RemoteExamples)
    with pytest.raises(RuntimeError, match=f"the examples of client {client.client_id} stay on its site"):
        client.train[0]
    with pytest.raises(UserError, match="stay on their sites"):
        joined.corpus()


def test_the_unseen_pool_by_name(sites):
    from fedpeft.core.registry import DATASETS

    def build(**fields: object):  # noqa: ANN202
        return DATASETS.get("files")(DataConfig(name="files", path=str(sites["union"]), **fields))

    assert [c.client_id for c in build(unseen_clients=["bo", "eve"]).pool("unseen")] == ["bo", "eve"]
    with pytest.raises(UserError, match=r"data.unseen_clients names \['zed'\], which the data does not hold"):
        build(unseen_clients=["bo", "zed"])
    with pytest.raises(UserError, match="Give either data.unseen_clients or data.unseen_fraction, not both"):
        build(unseen_clients=["bo"], unseen_fraction=0.2)
    with pytest.raises(UserError, match="leaves no seen client among 5"):
        build(unseen_clients=["ana", "bo", "cy", "dee", "eve"])


def test_sites_that_do_not_fit_together_are_refused():
    cfg = DataConfig(name="files", partition="natural", sites=2)
    one = {"name": "files", "task": "classification", "label_names": ["a", "b"], "groups": ["x"]}
    one["clients"] = [{"id": "x", "group": "x", "pool": "seen", "train": 3, "test": 1}]
    with pytest.raises(UserError, match=r"Client 'x' is on two sites \(SuperNodes 1 and 2\)"):
        join_sites(cfg, {1: one, 2: one})
    other = {**one, "label_names": ["b", "a"], "clients": [{**one["clients"][0], "id": "y"}]}
    with pytest.raises(UserError, match="The sites disagree on the label names .* set data.label_names"):
        join_sites(cfg, {1: one, 2: other})


def test_site_local_data_needs_a_deployment_and_no_central_base(sites):
    raw = site_raw(sites)
    with pytest.raises(UserError, match="data.sites keeps the data on the sites of a deployment"):
        Experiment(validate(raw), Path("unused"))
    raw["base"] = {"kind": "centralized"}
    with pytest.raises(UserError, match="base.kind=centralized trains on a base corpus"):
        Experiment(validate(raw), Path("unused"), data=object())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- in process
def test_two_sites_equal_a_local_run_over_the_union(tmp_path, sites, task_identity):  # noqa: F811
    """Two nodes, each with its own data-path; the server has none. Pools, sampling and every record equal the
    local engine's over the union of the files; each node served its own clients only."""
    grid = site_grid(sites, {"data-path": str(sites["site-a"])}, {"data-path": str(sites["site-b"])})
    flower = run_over_grid(grid, flower_config(validate(site_raw(sites, unseen_fraction=0.2))), tmp_path / "flower")
    local = Experiment(validate(union_raw(sites, unseen_fraction=0.2)), tmp_path / "local").run()
    assert_same_records(local, flower)
    tested = {(key[2], key[3]) for key in read_records(flower) if key[7] == "test"}
    assert {client for _, client in tested} == {"ana", "bo", "cy", "dee", "eve"}
    config = yaml.safe_load((flower / "config.yaml").read_text())
    assert config["data"]["unseen_clients"] == [client for pool, client in sorted(tested) if pool == "unseen"]
    assert len(config["data"]["unseen_clients"]) == 1
    assert all(served[0] == "query.site" for served in grid.served.values())


def test_a_client_on_two_sites_or_too_few_sites_stop_the_run(tmp_path, sites, task_identity):  # noqa: F811
    same = {"data-path": str(sites["site-a"])}
    grid = site_grid(sites, same, same)
    with pytest.raises(UserError, match=r"Client 'ana' is on two sites \(SuperNodes 1000 and 1001\)"):
        run_over_grid(grid, flower_config(validate(site_raw(sites))), tmp_path / "dup")
    assert all(served == ["query.site"] for served in grid.served.values())  # no task reached any node
    assert not (tmp_path / "dup").exists()

    grid = site_grid(sites, {"data-path": str(sites["site-a"])}, {})  # the second node has no data-path
    with pytest.raises(
        UserError,
        match=r"1 of the 2 sites \(data.sites\) reported their clients within 1 s; node "
        "1001: .*has no data-path",
    ):
        run_over_grid(grid, flower_config(validate(site_raw(sites))), tmp_path / "few", node_timeout=1.0)

    raw = site_raw(sites)
    raw["model"] = {"name": "tiny-bert"}
    with pytest.raises(UserError, match="Model tiny-bert trains its tokenizer on the dataset's texts"):
        run_over_grid(grid, flower_config(validate(raw)), tmp_path / "tiny")


def test_a_restarted_site_takes_its_clients_back(tmp_path, sites, task_identity):  # noqa: F811
    """Site B lost mid-run: its clients are left out of the rounds it misses; back with a new node id and the same
    data-path, it serves them again from the next step, and a node that claims a client in service is refused."""
    raw = site_raw(sites)
    raw["methods"] = [raw["methods"][0] | {"rounds": 4}]
    grid = site_grid(sites, {"data-path": str(sites["site-a"])}, {"data-path": str(sites["site-b"])})
    lose_and_restart(grid)  # site B: down in round 1, back as node 1005 during round 2
    progress = RoundLog()
    cfg = flower_config(validate(raw))
    data, owners, cfg = register_sites(grid, cfg, node_timeout=10)
    out = Experiment(cfg, tmp_path / "run", progress, data=data).run(
        engine_factory=lambda worker: GridEngine(grid, worker, sites=owners)
    )
    # Round 0 with both sites, rounds 1 and 2 without site B's two clients, round 3 with all five again.
    assert [m["clients"] for m in progress.round_metrics] == [5.0, 3.0, 3.0, 5.0]
    assert grid.served[1005][0] == "query.site" and "train.personalize" in grid.served[1005]
    assert {key[3] for key in read_records(out) if key[0] == "fedit" and key[7] == "test"} == {
        "ana",
        "bo",
        "cy",
        "dee",
        "eve",
    }

    # A third node with site A's data joins while site A's node serves: refused, never silently preferred.
    grid = site_grid(sites, {"data-path": str(sites["site-a"])}, {"data-path": str(sites["site-b"])})
    data, owners, cfg = register_sites(grid, flower_config(validate(site_raw(sites))), node_timeout=10)
    server = SimpleNamespace(cfg=cfg, run_dir=tmp_path, data=data)  # what the engine reads of the server's worker
    engine = GridEngine(grid, server, sites=owners)  # type: ignore[arg-type]
    grid.contexts[1002] = Context(
        run_id=1, node_id=1002, node_config={"data-path": str(sites["site-a"])}, state=RecordDict(), run_config={}
    )
    grid.served[1002] = []
    engine.membership.lose(1001, "no reply")
    with pytest.raises(UserError, match=r"SuperNodes 1000 and 1002 both hold client 'ana'"):
        engine.membership.refresh()


# ---------------------------------------------------------------------------------------------- deployment
@pytest.mark.slow
def test_site_local_data_on_loopback(tmp_path, sites):
    """A SuperLink and two SuperNodes on loopback, each node with its own data directory; `fedpeft launch` with a
    config that names no data path. The results equal the local engine's over the union of the data, with the
    two methods running at once (the deployment's default)."""
    raw = site_raw(sites)  # FedIT and LoRA, at once (the deployment's default): their messages interleave
    config = tmp_path / "sites.yaml"
    config.write_text(yaml.safe_dump(raw))
    worker_dir = Path(tempfile.mkdtemp(prefix="fp"))  # short: a Unix socket's path is limited to ~100 bytes
    node_configs = [
        f"data-path='{sites[site]}' run-dir='{tmp_path / site}' worker-dir='{worker_dir}'" for site in SITES
    ]
    out = tmp_path / "out"
    with LoopbackDeployment(tmp_path, node_configs, {"OMP_NUM_THREADS": "1"}) as deployment:
        finished = launch(deployment, config, out)
    logs = finished.stdout + finished.stderr
    assert finished.returncode == 0, logs[-4000:]
    local = Experiment(validate(union_raw(sites)), tmp_path / "local").run()
    assert_same_records(local, out)
    data = json.loads((out / "data.json").read_text())
    assert data["sites"] == 2 and data["num clients"] == 5
