"""Shared fixtures: real PostgreSQL and S3-protocol servers on 127.0.0.1, stores, table locations, corpus.

Services start lazily, the first time a test requests them, and stop at the end of the session.

- ``pg_url`` (session): SQLAlchemy URL of a throwaway PostgreSQL database (or ``DELTA_MIRROR_TEST_PG``).
- ``pg_server`` (session): the ``PgServer`` behind it (``stop()``, ``start()``, ``restart()``,
  ``create_database()``).
- ``pg_restart`` (function): a callable that restarts the server (crash-style by default).
- ``pg_store_url`` (function): a fresh, empty database per test, dropped afterwards.
- ``s3`` (session): the ``S3Server`` (``endpoint``, keys, ``region``, ``make_bucket()``, ``env()``).
- ``s3_env`` (function): sets the ``AWS_*`` variables for the test and yields a fresh bucket name.
- ``store_url`` (function, parametrized sqlite/postgres/mysql/duckdb): a fresh store URL.
- ``store`` (function): an initialised ``SqlStore`` on ``store_url``, closed after the test.
- ``module_store_url`` (module, parametrized like ``store_url``): a fresh store URL for one module.

The ``mysql`` and ``duckdb`` params run only where the store is what is tested (``tests/store/``,
and tests marked ``all_backends``); elsewhere they are deselected, so a suite where the store is
incidental (bad CLI input, the UI, Airflow) stays on SQLite and PostgreSQL (``_runs_on_every_backend``).
- ``table_location`` (function, parametrized local/s3): a fresh table root URI.
- ``lake`` (function): a fresh empty folder ``tmp_path/lake`` (the root a commit service serves).
- ``corpus_dir`` (session): the shared Delta corpus (``DELTA_MIRROR_CORPUS``), skipped when absent.

A test that needs a server, a JVM or a cluster is marked ``service`` (and the service's own marker)
from the fixtures it requests (``_SERVICE_MARKERS``), its store or location param, or its folder;
one that takes seconds without a service is marked ``slow`` (a DAG run: ``_SLOW_FIXTURES``, else by
hand); ``make check`` runs the rest (``-m "not service and not slow"``). A server or Spark started for a test without
the marker (a fixture reached with ``request.getfixturevalue``, ``shared_spark()`` called directly)
fails that test (``support.services.refuse_unmarked``), so the inner loop never starts one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest
from support import services
from support.services import PG_ENV, PgServer, S3Server, corpus_path, session_service
from support.stores import init_store

from delta_mirror.store import SqlStore


def repo_root() -> Path:
    here = Path(__file__).resolve().parent
    for d in (here, *here.parents):
        if (d / "pyproject.toml").exists():
            return d
    return here.parent


# --------------------------------------------------------------------------------------------------
# markers: tests that use a service get its marker, so ``-m "not postgres"`` etc. work

_SERVICE_MARKERS = {
    "pg_url": "postgres",
    "pg_server": "postgres",
    "pg_restart": "postgres",
    "pg_store_url": "postgres",
    "mariadb_server": "mysql",
    "mysql_store_url": "mysql",
    "s3": "s3",
    "s3_env": "s3",
    "corpus_dir": "corpus",
    "spark": "spark",
    "logstore_loaded": "spark",
    "_needs_spark": "spark",
    "azurite": "emulator",
    "fake_gcs": "emulator",
    "minio": "emulator",
    "cloud": "emulator",
    "container": "emulator",
    "api_server": "airflow_server",
    "latency_server": "airflow_server",
    "fab": "airflow_server",
    "kernel": "jvm",
}

#: The markers of tests that need a server, a JVM or a cluster: each also gets ``service``, which
#: ``make check`` deselects (``-m "not service"``); a test is marked by the fixtures it requests, so
#: a new test on ``pg_url`` or ``spark`` leaves the inner loop by itself.
_NEEDS_A_SERVICE = {
    "postgres",
    "mysql",
    "s3",
    "emulator",
    "spark",
    "jvm",
    "airflow_server",
    "airflow_e2e",
    "cluster",
    "packaging",
}
#: Test folders (relative to tests/) whose every test needs a service, whatever its fixtures.
_SERVICE_DIRS = ("airflow_e2e", "cluster", "chaos", "packaging")
#: Fixtures that make a test take seconds with no service: ``airflow_db`` is requested by the tests
#: that run a DAG in Airflow (``dag.test()``, 1-20 s each: 24 tests, 60 s of the inner loop's 171 s).
#: They get ``slow``, which ``make check`` leaves to ``make test``, as does a test marked by hand.
_SLOW_FIXTURES = ("airflow_db",)

_NEW_MARKERS = (
    "spark: needs a SparkSession (a JVM; the session's one local[2] Spark)",
    "emulator: needs a storage emulator (Azurite, fake-gcs-server, MinIO)",
    "jvm: starts a JVM of its own (the delta-kernel-java reader)",
    "airflow_server: starts an Airflow API server (airflow standalone or api-server) for the module",
    "service: needs any server, JVM or cluster (set by tests/conftest.py); `make check` runs the rest",
    "one_process: what one run starts once (Spark, the JVMs, the cluster, the Airflow servers, e2e, "
    "packaging): make test's jvm shard (scripts/test_shards.py)",
    "slow: takes seconds without a service (a DAG run in Airflow, a timing wait, a subprocess that "
    "imports Airflow); `make check` leaves it to `make test`",
)


def pytest_configure(config: pytest.Config) -> None:
    for line in _NEW_MARKERS:
        config.addinivalue_line("markers", line)
    _own_ivy_cache(config)
    config.stash[_INNER_LOOP] = "not service" in str(config.getoption("markexpr", "") or "")


def _own_ivy_cache(config: pytest.Config) -> None:
    """A pytest-xdist worker past the first resolves the Delta jars into an Ivy cache of its own
    (``<repo>/.cache/ivy-gw1``, …): a JVM outside the one-worker group (a corpus sweep with Spark, a
    docs example's ``spark-submit``) must not resolve into the cache another worker is filling."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker and worker != "gw0" and "DELTA_MIRROR_SPARK_IVY" not in os.environ:
        os.environ["DELTA_MIRROR_SPARK_IVY"] = str(repo_root() / ".cache" / f"ivy-{worker}")


#: Whether this run leaves the ``service`` tests out (``make check``).
_INNER_LOOP = pytest.StashKey[bool]()


def _service_marks(item: pytest.Item) -> set[str]:
    """The service markers a test gets from the fixtures it requests and its store or location param."""
    names = set(getattr(item, "fixturenames", ()))
    marks = {m for f, m in _SERVICE_MARKERS.items() if f in names}
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        backend = _backend_of(item)
        if backend in {"postgres", "mysql", "duckdb"}:
            marks.add(backend)
        if callspec.params.get("table_location") == "s3":
            marks.add("s3")
    have = {mk.name for mk in item.iter_markers()}
    rel = Path(str(item.path)).resolve().relative_to(Path(__file__).resolve().parent)
    if (marks | have) & _NEEDS_A_SERVICE or (rel.parts and rel.parts[0] in _SERVICE_DIRS):
        marks.add("service")
    if any(f in names for f in _SLOW_FIXTURES):
        marks.add("slow")
    return marks - have


#: The backends that run only in the suites about the store (the rest stay on sqlite/postgres).
_STORE_ONLY_BACKENDS = {"mysql", "duckdb"}
#: Test folders (relative to tests/) whose every store test runs on every backend.
_EVERY_BACKEND_DIRS = ("store",)


def _runs_on_every_backend(item: pytest.Item) -> bool:
    """Whether a test parametrized with a MySQL or DuckDB store keeps that param: it is under
    ``_EVERY_BACKEND_DIRS`` or carries the ``all_backends`` marker (module, class or function),
    unless the marker's ``but=`` names the backend (``all_backends(but="duckdb")`` for a test of
    several processes on one store, which a DuckDB file does not allow)."""
    mark = item.get_closest_marker("all_backends")
    if mark is not None:
        but = mark.kwargs.get("but", ())
        return _backend_of(item) not in ((but,) if isinstance(but, str) else but)
    rel = Path(str(item.path)).resolve().relative_to(Path(__file__).resolve().parent)
    return bool(rel.parts) and rel.parts[0] in _EVERY_BACKEND_DIRS


def _backend_of(item: pytest.Item) -> str | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    for name in ("store_url", "module_store_url"):
        if name in callspec.params:
            return str(callspec.params[name])
    return None


# tryfirst: before pytest-xdist's worker hook, which reads the xdist_group marks added here
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    dropped = [i for i in items if _backend_of(i) in _STORE_ONLY_BACKENDS and not _runs_on_every_backend(i)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        kept = set(map(id, items)) - set(map(id, dropped))
        items[:] = [i for i in items if id(i) in kept]
    for item in items:
        for m in sorted(_service_marks(item)):
            item.add_marker(m)
        group = _one_worker_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            item.add_marker(pytest.mark.one_process)  # scripts/test_shards.py's jvm shard


#: Under pytest-xdist (``make test PYTEST_WORKERS=2``, ``--dist loadgroup``) each worker is a process
#: with its own PostgreSQL, MariaDB, S3 server, emulators and Airflow home (free ports, temporary
#: folders, fresh database names). What one run must start once runs on one worker: Spark (a JVM of
#: a GB; the Delta jars' Ivy cache is not safe for two resolutions at once), the Spark writers and
#: kernel-java JVMs, the cluster, the Airflow servers, the end-to-end Airflow and the packaging venvs.
#: (pytest 9.2 loses the group on its way to the scheduler, pytest-xdist issue 1386: hence opt-in.)
_ONE_WORKER = {"spark", "jvm", "cluster", "airflow_e2e", "airflow_server", "packaging"}
#: The folders whose every test runs there. Not chaos: its runs start their own servers (the faulty
#: S3 proxy, the failover's PostgreSQL pair) or restart the shard's own PostgreSQL between tests, and
#: no JVM; in the ``rest`` shard they balance the two (the ``jvm`` shard was the longer by ~190 s).
_ONE_PROCESS_DIRS = ("spark", "airflow_e2e", "cluster", "packaging")


def _one_worker_group(item: pytest.Item) -> str | None:
    rel = Path(str(item.path)).resolve().relative_to(Path(__file__).resolve().parent)
    if rel.parts and rel.parts[0] in _ONE_PROCESS_DIRS:
        return "one-worker"
    if {mk.name for mk in item.iter_markers()} & _ONE_WORKER:
        return "one-worker"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """In the inner loop, ``support.services.unmarked_test`` names the running test (none there is
    marked ``service``)."""
    unmarked = item.config.stash.get(_INNER_LOOP, False) and item.get_closest_marker("service") is None
    if unmarked:
        services.unmarked_test.append(item.nodeid)
    try:
        return (yield)
    finally:
        if unmarked:
            services.unmarked_test.clear()


# --------------------------------------------------------------------------------------------------
# PostgreSQL


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    yield from session_service(PgServer.from_env_or_start, PgServer.stop_and_remove, "PostgreSQL")


@pytest.fixture(scope="session")
def pg_url(pg_server: PgServer) -> str:
    return pg_server.url


@pytest.fixture
def pg_restart(pg_server: PgServer) -> Callable[..., None]:
    """``pg_restart(mode="immediate")`` stops and starts the server; skipped for an external server."""
    if not pg_server.owned:
        pytest.skip(f"pg_restart needs the throwaway server, not {PG_ENV}")
    return pg_server.restart


@pytest.fixture
def pg_store_url(pg_server: PgServer) -> Iterator[str]:
    """A fresh empty database for one test (``dm_<random>``), dropped with ``WITH (FORCE)`` afterwards."""
    url = pg_server.create_database()
    yield url
    if not pg_server.is_running():  # a fault test left it down
        pg_server.start()
    pg_server.drop_database(url)


# --------------------------------------------------------------------------------------------------
# S3


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    yield from session_service(S3Server, S3Server.stop, "the S3 server")


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the ``AWS_*`` variables at the test server for this test; return a fresh bucket name."""
    for var in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(var, raising=False)
    for k, v in s3.env().items():
        monkeypatch.setenv(k, v)
    no_proxy = ",".join(x for x in (os.environ.get("NO_PROXY"), "127.0.0.1", "localhost") if x)
    monkeypatch.setenv("NO_PROXY", no_proxy)
    monkeypatch.setenv("no_proxy", no_proxy)
    return s3.make_bucket()


# --------------------------------------------------------------------------------------------------
# MySQL / MariaDB


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[object]:
    """The throwaway MariaDB server (``support.mariadb``), or ``DELTA_MIRROR_TEST_MYSQL``'s."""
    from support.mariadb import MariaDbServer

    yield from session_service(MariaDbServer.from_env_or_start, MariaDbServer.stop_and_remove, "MariaDB")


@pytest.fixture
def mysql_store_url(mariadb_server: object) -> Iterator[str]:
    """A fresh empty MariaDB database for one test (``dm_<random>``), dropped afterwards."""
    from support.mariadb import MariaDbServer

    assert isinstance(mariadb_server, MariaDbServer)
    url = mariadb_server.create_database()
    yield url
    mariadb_server.drop_database(url)


# --------------------------------------------------------------------------------------------------
# parametrized store and table location


BACKENDS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", marks=pytest.mark.mysql),
    pytest.param("duckdb", marks=pytest.mark.duckdb),
]
#: The fixture giving a fresh database per test on a server backend.
_SERVER_STORE_URL = {"postgres": "pg_store_url", "mysql": "mysql_store_url"}
#: The session fixture of a server backend (``create_database()`` / ``drop_database(url)``).
_SERVER = {"postgres": "pg_server", "mysql": "mariadb_server"}


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh SQL store URL: ``sqlite:///<tmp>/store.db``, ``duckdb:///<tmp>/store.duckdb``, or a
    fresh PostgreSQL or MySQL/MariaDB database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    if request.param == "duckdb":
        return f"duckdb:///{tmp_path / 'store.duckdb'}"
    return str(request.getfixturevalue(_SERVER_STORE_URL[request.param]))


@pytest.fixture(scope="module", params=BACKENDS)
def module_store_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A fresh store URL one module's tests share (a module fixture builds one world for many
    refusal cases): a SQLite or DuckDB file, or a server database dropped after the module."""
    if request.param in ("sqlite", "duckdb"):
        suffix = "db" if request.param == "sqlite" else "duckdb"
        yield f"{request.param}:///{tmp_path_factory.mktemp('module-store') / f'store.{suffix}'}"
        return
    server = request.getfixturevalue(_SERVER[request.param])
    url = server.create_database()
    yield url
    server.drop_database(url)


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    """An initialised ``SqlStore`` on ``store_url`` (so on every backend it is parametrized with), closed after."""
    with closing(init_store(store_url)) as s:
        yield s


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """A fresh empty folder ``tmp_path/lake``: the root a commit service serves."""
    path = tmp_path / "lake"
    path.mkdir()
    return path


@pytest.fixture(params=["local", "s3"])
def table_location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh table root: a ``file://`` folder under tmp_path, or ``s3://<fresh bucket>/table`` (env set)."""
    if request.param == "local":
        folder = tmp_path / "table"
        folder.mkdir()
        return folder.as_uri()
    bucket = request.getfixturevalue("s3_env")
    return f"s3://{bucket}/table"


# --------------------------------------------------------------------------------------------------
# corpus


@pytest.fixture(scope="session")
def corpus_dir() -> Path:
    path = corpus_path()
    if not path.is_dir():
        pytest.skip(f"corpus not found at {path}: set DELTA_MIRROR_CORPUS")
    return path
