"""The process launcher's own logic (delta_mirror.dev.cluster), fast: the topology files, the
one-line errors (port taken, binary missing, exited early), and a life cycle on a real process (the
SMTP catcher) that leaves nothing behind. The full topology runs in the cluster tests."""

from __future__ import annotations

import contextlib
import itertools
import random
import re
import shutil
import smtplib
import socket
import subprocess
import sys
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path

import pytest
from support.services import skip_or_fail

from delta_mirror.dev.cluster import Cluster, ClusterError, default_repo
from delta_mirror.dev.cluster.processes import marked_pids, port_taken
from delta_mirror.dev.cluster.topology import TopologyError, load_topology, parse_env, parse_topology

REPO = default_repo()
TOPOLOGY = load_topology(REPO / "docker")


def only(*keep: str) -> list[str]:
    """``skip=`` for a cluster of just ``keep``."""
    return [name for name in TOPOLOGY.services if name not in keep]


def free_port_base() -> int:
    """A base from which every port of the topology is free now."""
    span = sum(TOPOLOGY.port_slots.values())
    for _ in range(200):
        base = random.randrange(20000, 60000 - span)
        if not any(port_taken(p) for p in range(base, base + span)):
            return base
    raise AssertionError("no free port range found")


@pytest.fixture
def cluster_root(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "cl"
    yield root
    # whatever a test started, it must be gone (and is stopped here if the test failed)
    with contextlib.suppress(ClusterError):
        Cluster.attach(root, repo=REPO).down()


# -- the topology files ------------------------------------------------------------------------------


def test_the_repository_topology_has_the_issue_27_services_and_replicas() -> None:
    services = TOPOLOGY.services
    assert services["airflow-triggerer"].replicas == 2
    assert services["airflow-worker"].replicas == 2
    assert services["commit-service"].replicas == 2
    assert services["airflow-worker"].command == ("celery", "worker")
    assert TOPOLOGY.settings["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert int(TOPOLOGY.settings["AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD"]) > int(
        TOPOLOGY.settings["AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC"]
    )
    assert services["commit-service"].instance_names() == ["commit-service-1", "commit-service-2"]
    assert services["redis"].instance_names() == ["redis"]


def test_spark_in_the_topology_is_the_pinned_pyspark() -> None:
    pins = dict(
        line.split("==", 1) for line in (REPO / "requirements.txt").read_text().splitlines() if "==" in line
    )
    assert TOPOLOGY.settings["SPARK_VERSION"] == pins["pyspark"]
    assert TOPOLOGY.settings["AIRFLOW_VERSION"] == pins["apache-airflow[statsd]"]


def test_port_base_packs_the_ports_in_file_order_with_a_slot_per_replica() -> None:
    ports = TOPOLOGY.ports(30000)
    keys = list(TOPOLOGY.port_slots)
    assert ports[keys[0]] == 30000
    for before, key in itertools.pairwise(keys):
        assert ports[key] == ports[before] + TOPOLOGY.port_slots[before]
    assert len(set(ports.values())) == len(ports)
    assert TOPOLOGY.ports()["AIRFLOW_API_PORT"] == int(TOPOLOGY.settings["AIRFLOW_API_PORT"])


def test_cluster_processes_get_distinct_ports(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, repo=REPO, port_base=30000, triggerers=2, workers=2)
    ports = [p for inst in cluster.instances for p in inst.ports.values()]
    assert len(ports) == len(set(ports))
    assert cluster.instance("airflow-triggerer-2").ports == {}  # its log server is Compose-only
    assert cluster.url("commit-service-2") == f"http://127.0.0.1:{cluster.port('commit-service-1') + 1}"
    assert cluster.url("spark-master").startswith("spark://127.0.0.1:")
    assert "mailpit" in cluster.names() and cluster.instance("mailpit").ports.keys() == {"smtp"}


def test_a_reduced_cluster_names_its_processes() -> None:
    cluster = Cluster("/nonexistent", repo=REPO, triggerers=2, workers=1, skip=["mailpit"])
    names = cluster.names()
    assert names.count("airflow-scheduler") == 1
    assert [n for n in names if n.startswith("airflow-worker")] == ["airflow-worker-1"]
    assert [n for n in names if n.startswith("airflow-triggerer")] == [
        "airflow-triggerer-1",
        "airflow-triggerer-2",
    ]
    assert "mailpit" not in names


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("A=1\nnot a setting\n", "stack.env:2: expected KEY=VALUE"),
        ("A=1\nA=2\n", "stack.env:2: A is set twice"),
        ('A="quoted"\n', "no quotes"),
        ("A=${B}\n", "no quotes or ${...}"),
    ],
)
def test_a_malformed_stack_env_line_is_named(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=re.escape(message)):
        parse_env(text)


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("ports: {P: 1}\nservices: {a: {kind: rocket}}\n", "kind 'rocket' is not one of"),
        ("ports: {P: 1}\nservices: {a: {kind: redis, ports: {main: Q}}}\n", "Q, which is not in"),
        ("ports: {P: 1}\nservices: {a: {kind: redis, ports: {main: P}, replicas: 2}}\n", "2 replicas but P"),
        ("ports: {P: 1}\nservices: {a: {kind: redis, after: [b]}, b: {kind: redis}}\n", "listed before b"),
        ("ports: {P: 1}\nservices: {a: {kind: redis, colour: red}}\n", "unknown field"),
        ("services: [1, 2]\n", "expected top-level"),
    ],
)
def test_a_malformed_stack_yaml_is_refused_with_the_reason(yaml_text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        parse_topology("P=1000\n", yaml_text)


def test_a_port_base_too_high_is_refused() -> None:
    with pytest.raises(TopologyError, match="out of range"):
        TOPOLOGY.ports(65530)


# -- one-line errors before anything starts ----------------------------------------------------------


def test_a_taken_port_is_named_before_anything_starts(cluster_root: Path) -> None:
    base = free_port_base()
    smtp_port = TOPOLOGY.ports(base)["SMTP_PORT"]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", smtp_port))
        squatter.listen()
        cluster = Cluster(cluster_root, repo=REPO, port_base=base, skip=only("redis", "mailpit"))
        with pytest.raises(ClusterError) as caught:
            cluster.up()
    message = str(caught.value)
    assert message.startswith(f"mailpit: port 127.0.0.1:{smtp_port} (smtp) is taken")
    assert "--port-base" in message and "\n" not in message
    assert cluster.running() == []  # redis, listed first, was never started


def test_a_missing_redis_server_says_how_to_install_it(
    cluster_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    cluster = Cluster(cluster_root, repo=REPO, port_base=free_port_base(), skip=only("redis"))
    with pytest.raises(ClusterError, match=r"^redis: redis-server not found: apt-get install redis-server"):
        cluster.up()


def test_a_missing_minio_binary_names_the_go_install(
    cluster_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "checkout"  # a checkout whose .cache has no MinIO yet
    (repo / "docker").mkdir(parents=True)
    for name in ("stack.env", "stack.yaml"):
        shutil.copy(REPO / "docker" / name, repo / "docker" / name)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    cluster = Cluster(cluster_root, repo=repo, port_base=free_port_base(), skip=only("minio"))
    with pytest.raises(ClusterError) as caught:
        cluster.up()
    assert str(caught.value).startswith("minio: MinIO not found at ")
    assert f"go install github.com/minio/minio@{TOPOLOGY.settings['MINIO_MODULE_VERSION']}" in str(
        caught.value
    )


def test_a_service_that_exits_at_start_is_named_with_its_last_log_lines(cluster_root: Path) -> None:
    cluster_root.mkdir()
    (cluster_root / "mail").write_text("a file where the catcher wants its folder")
    cluster = Cluster(cluster_root, repo=REPO, port_base=free_port_base(), skip=only("mailpit"))
    with pytest.raises(ClusterError) as caught:
        cluster.up()
    message = str(caught.value)
    assert message.startswith("mailpit exited early (code 1): ")
    assert "FileExistsError" in message and "[log: " in message
    assert marked_pids(cluster._token) == []


# -- life cycle on a real process ------------------------------------------------------------------


def test_down_with_nothing_running_says_so(cluster_root: Path) -> None:
    with pytest.raises(ClusterError, match=r"no cluster under .* nothing was started there"):
        Cluster.attach(cluster_root, repo=REPO)
    run = subprocess.run(
        [sys.executable, "-m", "delta_mirror.dev.cluster", "--root", str(cluster_root), "down"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("nothing to stop: no cluster under")


def test_the_mail_catcher_keeps_each_message_and_down_leaves_nothing(cluster_root: Path) -> None:
    cluster = Cluster(cluster_root, repo=REPO, port_base=free_port_base(), skip=only("mailpit"))
    cluster.up()
    token = cluster._token
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "a@example.com", "b@example.com", "lag over SLO"
    msg.set_content("table sales")
    with smtplib.SMTP("127.0.0.1", cluster.port("mailpit"), timeout=30) as smtp:
        smtp.send_message(msg)
    caught = list(cluster.mail_dir.glob("*.eml"))
    assert len(caught) == 1 and b"Subject: lag over SLO" in caught[0].read_bytes()

    other = Cluster.attach(cluster_root, repo=REPO)  # as `make cluster-status` / `cluster-down` see it
    [status] = other.status()
    assert status.name == "mailpit" and status.alive and status.pid == cluster.pids("mailpit")[0]
    assert other.down() == ["mailpit"]
    assert marked_pids(token) == []
    assert not (cluster_root / "state.json").exists()


def test_a_killed_process_is_restarted_on_its_port(cluster_root: Path) -> None:
    cluster = Cluster(cluster_root, repo=REPO, port_base=free_port_base(), skip=only("mailpit"))
    cluster.up()
    first = cluster.pids("mailpit")
    cluster.kill("mailpit")
    assert cluster.pids("mailpit") == [] and cluster.running() == []
    cluster.start("mailpit")
    assert cluster.pids("mailpit") and cluster.pids("mailpit") != first
    with smtplib.SMTP("127.0.0.1", cluster.port("mailpit"), timeout=30) as smtp:
        assert smtp.noop()[0] == 250
    assert cluster.down() == ["mailpit"]


def test_the_cli_reports_a_taken_port_in_one_line_and_exits_1(cluster_root: Path) -> None:
    base = free_port_base()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", TOPOLOGY.ports(base)["SMTP_PORT"]))
        squatter.listen()
        run = subprocess.run(
            [sys.executable, "-m", "delta_mirror.dev.cluster", "--root", str(cluster_root), "up"]
            + ["--port-base", str(base)]
            + [arg for name in only("mailpit") for arg in ("--skip", name)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("cluster: mailpit: port 127.0.0.1:")


def test_heal_starts_again_only_what_died(cluster_root: Path) -> None:
    if shutil.which("redis-server") is None:
        skip_or_fail("redis-server not found: make services (apt-get install redis-server)")
    cluster = Cluster(cluster_root, repo=REPO, port_base=free_port_base(), skip=only("redis", "mailpit"))
    cluster.up()
    redis_pids = cluster.pids("redis")
    cluster.kill("mailpit")
    assert cluster.heal() == ["mailpit"]
    assert cluster.pids("mailpit") and cluster.pids("redis") == redis_pids
    assert cluster.heal() == []
    assert sorted(cluster.down()) == ["mailpit", "redis"]
