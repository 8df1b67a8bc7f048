"""The stack of docker-compose.yaml as plain processes on this machine: ``make cluster``.

``Cluster(root)`` starts the services docker/stack.yaml lists (PostgreSQL, Redis, MinIO, an SMTP
catcher, a Spark standalone master + worker, Airflow with CeleryExecutor: api-server, scheduler,
dag-processor, N triggerers, N Celery workers, and N commit-service replicas), all on 127.0.0.1,
with the settings of docker/stack.env. Its state lives under ``root`` (default ``.cluster/``):
``state.json`` (PIDs, ports), ``logs/``, ``data/``, ``mail/`` (caught mail, one .eml each),
``secrets.env`` and ``env`` (what a shell sources to use the cluster; both mode 600).

    cluster = Cluster(tmp / ".cluster", port_base=23000, triggerers=2, workers=1)
    cluster.up()                       # waits for every service; ClusterError (one line) if one fails
    cluster.kill("airflow-triggerer-1")            # SIGKILL its process group and marked children
    cluster.restart("redis")                       # stop, start again, wait until ready
    cluster.url("airflow-api-server"), cluster.url("commit-service-2"), cluster.env()
    cluster.down()                     # stops everything it started, by PID; nothing is left

Another process attaches to a running cluster with ``Cluster.attach(root)`` (``down``/``status``).
Every wait polls until a deadline scaled by ``timeout_scale`` (``DELTA_MIRROR_CLUSTER_TIMEOUT_SCALE``).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import secrets as _secrets
import signal
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from delta_mirror.dev.cluster.processes import (
    INSTANCE_MARKER,
    ClusterError,
    Proc,
    alive,
    descendants,
    group_pids,
    marked_pids,
    port_taken,
    rss_kib,
    signal_group,
    spawn,
    wait_gone,
)
from delta_mirror.dev.cluster.secret_file import cluster_secrets
from delta_mirror.dev.cluster.services import Instance, Recipe, Stack
from delta_mirror.dev.cluster.topology import Topology, TopologyError, load_topology

__all__ = ["Cluster", "ClusterError", "ProcessStatus", "TopologyError", "default_repo"]

_INFRA_KINDS = ("postgres", "redis", "minio", "smtp")  # stopped last, after what uses them
# The signal of a kind's fast, clean shutdown where it is not SIGTERM (PostgreSQL's "smart" shutdown
# would wait for every client to leave).
_STOP_SIGNALS = {"postgres": signal.SIGINT}
_REPLICA_OPTIONS = {
    "airflow-triggerer": "triggerers",
    "airflow-worker": "workers",
    "commit-service": "commit_replicas",
}


def default_repo() -> Path:
    """The checkout this package runs from (editable install), else the working directory."""
    here = Path(__file__).resolve().parents[4]
    return here if (here / "docker" / "stack.yaml").exists() else Path.cwd()


@dataclass(frozen=True)
class ProcessStatus:
    """One process of the cluster as ``status()`` sees it."""

    name: str
    pid: int
    alive: bool
    pids: int  # processes in its group or carrying its marker
    rss_mib: float
    ports: Mapping[str, int]
    log: Path


class Cluster:
    """One cluster's processes under ``root``; see the module docstring."""

    def __init__(
        self,
        root: Path | str | None = None,
        *,
        repo: Path | None = None,
        port_base: int | None = None,
        triggerers: int = 2,
        workers: int = 2,
        commit_replicas: int = 2,
        skip: Collection[str] = (),
        table_config: Path | None = None,
        timeout_scale: float | None = None,
    ) -> None:
        self.repo = (repo or default_repo()).resolve()
        self.root = Path(root).resolve() if root is not None else self.repo / ".cluster"
        self.topology: Topology = load_topology(self.repo / "docker")
        self.port_base = port_base
        self.replicas = {"triggerers": triggerers, "workers": workers, "commit_replicas": commit_replicas}
        self.skip = frozenset(skip)
        unknown = self.skip - set(self.topology.services)
        if unknown:
            raise ClusterError(f"cannot skip {sorted(unknown)}: not services of docker/stack.yaml")
        self.table_config = (table_config or self.repo / "docker" / "delta_mirror.compose.yaml").resolve()
        scale = timeout_scale or float(os.environ.get("DELTA_MIRROR_CLUSTER_TIMEOUT_SCALE", "1") or 1)
        self.timeout_scale = max(scale, 0.01)
        self.ports = self.topology.ports(port_base)
        self.instances = self._instances()
        self._procs: dict[str, Proc] = {}
        self._token = ""
        self.ready_after: dict[str, float] = {}  # seconds from up() to ready, per process
        self.forced: list[str] = []  # processes a stop had to SIGKILL after their grace period

    # -- topology --------------------------------------------------------------------------------

    def _instances(self) -> list[Instance]:
        out = []
        for spec in self.topology.services.values():
            if spec.name in self.skip:
                continue
            count = (
                self.replicas[_REPLICA_OPTIONS[spec.name]] if spec.name in _REPLICA_OPTIONS else spec.replicas
            )
            if count < 0:
                raise ClusterError(f"{spec.name}: replicas must be >= 0, got {count}")
            for key in spec.ports.values():
                if count > self.topology.port_slots[key]:
                    raise ClusterError(
                        f"{spec.name}: {count} replicas but docker/stack.yaml reserves "
                        f"{self.topology.port_slots[key]} port(s) for {key}"
                    )
            for i, name in enumerate(spec.instance_names(count), 1):
                ports = {
                    role: self.ports[key] + i - 1
                    for role, key in spec.ports.items()
                    if role not in spec.compose_only
                }
                out.append(Instance(name=name, spec=spec, index=i, ports=ports))
        return out

    def instance(self, name: str) -> Instance:
        for inst in self.instances:
            if inst.name == name:
                return inst
        raise ClusterError(f"no process {name!r} in this cluster; there are: {', '.join(self.names())}")

    def names(self) -> list[str]:
        """The process names, in start order."""
        return [inst.name for inst in self.instances]

    # -- files -----------------------------------------------------------------------------------

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def mail_dir(self) -> Path:
        """Where the SMTP catcher writes each message it accepts (``<ns>-<n>.eml``)."""
        return self.root / "mail"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{self.instance(name).name}.log"

    def stack(self) -> Stack:
        return Stack(
            root=self.root,
            repo=self.repo,
            topology=self.topology,
            ports=self.ports,
            secrets=cluster_secrets(self.root),
            token=self._token or "unstarted",
            table_config=self.table_config,
        )

    def _save_state(self) -> None:
        state = {
            "token": self._token,
            "port_base": self.port_base,
            "replicas": self.replicas,
            "skip": sorted(self.skip),
            "table_config": str(self.table_config),
            "processes": {n: {"pid": p.pid, "log": str(p.log)} for n, p in self._procs.items()},
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(self.state_file)

    @classmethod
    def attach(cls, root: Path | str | None = None, *, repo: Path | None = None) -> Cluster:
        """The cluster whose state.json is under ``root`` (started by another process)."""
        repo = (repo or default_repo()).resolve()
        root_path = Path(root).resolve() if root is not None else repo / ".cluster"
        try:
            state = json.loads((root_path / "state.json").read_text())
        except FileNotFoundError:
            raise ClusterError(
                f"no cluster under {root_path} (no state.json): nothing was started there"
            ) from None
        except ValueError as exc:
            raise ClusterError(f"{root_path / 'state.json'} is not valid JSON: {exc}") from None
        cluster = cls(
            root_path,
            repo=repo,
            port_base=state.get("port_base"),
            skip=state.get("skip", ()),
            table_config=Path(state["table_config"]) if state.get("table_config") else None,
            **state.get("replicas", {}),
        )
        cluster._token = state.get("token", "")
        for name, p in state.get("processes", {}).items():
            cluster._procs[name] = Proc(name=name, pid=int(p["pid"]), log=Path(p["log"]))
        return cluster

    # -- addresses -------------------------------------------------------------------------------

    def port(self, name: str, role: str | None = None) -> int:
        """The port of process ``name`` (its only or ``main``/``http`` one, or ``role``)."""
        ports = self.instance(name).ports
        if role is None:
            role = next((r for r in ("main", "http", "smtp") if r in ports), None)
        if role is None or role not in ports:
            raise ClusterError(f"{name} has no port {role!r}; it has {sorted(ports)}")
        return ports[role]

    def url(self, name: str, role: str | None = None) -> str:
        """Where process ``name`` answers: http://, or spark:// / redis:// / smtp:// / postgresql://."""
        inst = self.instance(name)
        port = self.port(name, role)
        scheme = "http"
        if role in (None, "main"):
            scheme = {"spark-master": "spark", "redis": "redis", "postgres": "postgresql"}.get(
                inst.spec.kind, "http"
            )
        if inst.spec.kind == "smtp" and role in (None, "smtp"):
            scheme = "smtp"
        return f"{scheme}://127.0.0.1:{port}"

    def env(self) -> dict[str, str]:
        """What a client of the cluster needs (the `delta-mirror` and `airflow` CLIs, a Spark driver):
        store, S3, commit service URLs and token, Spark master, Airflow settings. Contains secrets."""
        stack = self.stack()
        env = stack.airflow_env(self.replicas["commit_replicas"])
        for key in (*stack.base_env(), INSTANCE_MARKER):
            if key != "PATH":
                env.pop(key, None)
        return env

    # -- life cycle ------------------------------------------------------------------------------

    def running(self) -> list[str]:
        """The recorded processes still alive."""
        return [n for n, p in self._procs.items() if self._alive(n, p)]

    def _alive(self, name: str, proc: Proc) -> bool:
        return (
            proc.running()
            or bool(group_pids(proc.pid))
            or bool(self._token and marked_pids(self._token, name))
        )

    def preflight(self) -> dict[str, Recipe]:
        """Every process's recipe (a missing binary raises here) and its ports free (checked before
        anything starts, so a clash costs nothing)."""
        stack = self.stack()
        recipes = {inst.name: stack.recipe(inst, self.replicas["commit_replicas"]) for inst in self.instances}
        if any(inst.spec.name == "airflow-worker" for inst in self.instances):
            try:
                importlib.metadata.version("apache-airflow-providers-celery")
            except importlib.metadata.PackageNotFoundError:
                version = self.topology.settings.get("AIRFLOW_CELERY_PROVIDER_VERSION", "")
                raise ClusterError(
                    "airflow-worker: the Celery provider is not installed: "
                    f"pip install apache-airflow-providers-celery=={version} (make venv)"
                ) from None
        for inst in self.instances:
            for role, port in inst.ports.items():
                if port_taken(port):
                    raise ClusterError(
                        f"{inst.name}: port 127.0.0.1:{port} ({role}) is taken by another program: stop it, "
                        "or choose other ports with --port-base N (DELTA_MIRROR_CLUSTER_PORT_BASE)"
                    )
        return recipes

    def up(self) -> float:
        """Start every process, each once what it needs is ready; the seconds it took. On any
        failure: stop what was started, then ClusterError naming the process and why."""
        if self.state_file.exists():
            with contextlib.suppress(ClusterError):
                old = Cluster.attach(self.root, repo=self.repo)
                if old.running():
                    raise ClusterError(
                        f"a cluster is already running under {self.root} ({', '.join(old.running())}): "
                        "make cluster-down first"
                    )
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        self._token = _secrets.token_hex(8)
        self._procs = {}
        recipes = self.preflight()
        t0 = time.monotonic()
        try:
            self._start_all(recipes, t0)
        except BaseException:
            self.down()
            raise
        self._write_env_file()
        return time.monotonic() - t0

    def _deps_ready(self, inst: Instance, ready_services: set[str]) -> bool:
        return all(dep in ready_services or dep in self.skip for dep in inst.spec.after)

    def _start_all(self, recipes: dict[str, Recipe], t0: float) -> None:
        pending = list(self.instances)
        waiting: dict[str, tuple[Instance, float]] = {}  # name -> (instance, deadline)
        ready: set[str] = set()
        while pending or waiting:
            services_ready = {
                spec
                for spec in self.topology.services
                if all(i.name in ready for i in self.instances if i.spec.name == spec)
            }
            for inst in [i for i in pending if self._deps_ready(i, services_ready)]:
                pending.remove(inst)
                self._spawn(inst, recipes[inst.name])
                waiting[inst.name] = (
                    inst,
                    time.monotonic() + recipes[inst.name].timeout * self.timeout_scale,
                )
            if not waiting and pending:
                raise ClusterError(f"cannot order the start of {[i.name for i in pending]} (check 'after')")
            for name, (inst, deadline) in list(waiting.items()):
                if self._check_ready(inst, recipes[name], deadline):
                    del waiting[name]
                    ready.add(name)
                    self.ready_after[name] = time.monotonic() - t0
            if waiting:
                time.sleep(0.5)

    def _spawn(self, inst: Instance, recipe: Recipe) -> None:
        if recipe.prepare is not None:
            recipe.prepare()
        env = {**recipe.env, "DELTA_MIRROR_CLUSTER": self._token, INSTANCE_MARKER: inst.name}
        log = self.root / "logs" / f"{inst.name}.log"
        self._procs[inst.name] = spawn(
            inst.name, recipe.argv, env=env, log=log, cwd=self.root, user=recipe.user
        )
        self._save_state()

    def _check_ready(self, inst: Instance, recipe: Recipe, deadline: float) -> bool:
        """Whether ``inst`` is ready now (its after-ready steps done); raises when it died or is late."""
        from delta_mirror.dev.cluster.processes import log_tail

        proc = self._procs[inst.name]
        running = proc.running()
        if recipe.oneshot and not running:
            assert proc.popen is not None
            if proc.popen.returncode != 0:
                raise ClusterError(
                    f"{inst.name} failed (code {proc.popen.returncode}): {log_tail(proc.log)} [log: {proc.log}]"
                )
        elif not running:
            code = proc.popen.returncode if proc.popen is not None else None
            raise ClusterError(
                f"{inst.name} exited early (code {code}): {log_tail(proc.log)} [log: {proc.log}]"
            )
        elif not recipe.ready(group_pids(proc.pid)):
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"{inst.name} not ready after {recipe.timeout * self.timeout_scale:.0f} s "
                    f"({recipe.what}): {log_tail(proc.log)} [log: {proc.log}]"
                )
            return False
        for step in recipe.after_ready:
            step()
        return True

    def _write_env_file(self) -> None:
        import shlex

        lines = ["# The cluster's client environment: `. .cluster/env` (contains secrets)"]
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.env().items()) if k != "PATH"]
        fd = os.open(self.root / "env", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT: forced on every start
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")

    def start(self, *names: str) -> None:
        """Start stopped processes again (at once) and wait until each is ready."""
        recipes: dict[str, Recipe] = {}
        for name in names:
            inst = self.instance(name)
            if name in self._procs and self._alive(name, self._procs[name]):
                raise ClusterError(f"{name} is running already (pid {self._procs[name].pid})")
            for role, port in inst.ports.items():
                if port_taken(port):
                    raise ClusterError(f"{name}: port 127.0.0.1:{port} ({role}) is still taken")
            recipes[name] = self.stack().recipe(inst, self.replicas["commit_replicas"])
        waiting = {}
        for name, recipe in recipes.items():
            self._spawn(self.instance(name), recipe)
            waiting[name] = time.monotonic() + recipe.timeout * self.timeout_scale
        while waiting:
            for name, deadline in list(waiting.items()):
                if self._check_ready(self.instance(name), recipes[name], deadline):
                    del waiting[name]
            if waiting:
                time.sleep(0.5)

    def heal(self) -> list[str]:
        """Start again every long-running process that has died (as Compose's ``restart:
        unless-stopped`` would; e.g. Airflow's scheduler, dag-processor and triggerers exit when
        PostgreSQL restarts), leftovers killed first; the names started, in start order."""
        dead = [
            inst.name
            for inst in self.instances
            if inst.name in self._procs
            and not inst.spec.oneshot
            and not self._alive(inst.name, self._procs[inst.name])
        ]
        for name in dead:
            self._stop([name], grace=5.0)
        infra = [n for n in dead if self.instance(n).spec.kind in _INFRA_KINDS]
        if infra:
            self.start(*infra)
        rest = [n for n in dead if n not in infra]
        if rest:
            self.start(*rest)
        return dead

    def kill(self, name: str, sig: int = signal.SIGKILL, wait: float = 30.0) -> None:
        """``sig`` to every process of ``name`` (its group, descendants and marked processes: a
        container dying). For SIGKILL/SIGTERM, waits up to ``wait`` s for all of them to be gone
        (then SIGKILL), so its ports are free for ``start(name)``."""
        proc = self._procs.get(self.instance(name).name)
        if proc is None:
            raise ClusterError(f"{name} was not started by this cluster")
        targets = self._pids_of([name])
        signal_group(proc.pid, sig)
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self._stop([name], grace=wait * self.timeout_scale, sig=sig, seen=targets)

    def restart(self, name: str, sig: int | None = None) -> None:
        """Stop ``name`` (``sig``, default its clean stop: SIGINT for PostgreSQL, else SIGTERM; then
        SIGKILL after a grace period) and start it again on the same ports; waits until ready."""
        self.instance(name)
        if name not in self._procs:
            raise ClusterError(f"{name} was not started by this cluster")
        self._stop([name], grace=30.0 * self.timeout_scale, sig=sig)
        self.start(name)

    def _pids_of(self, names: Collection[str]) -> list[int]:
        """Live processes of ``names``: process group, descendants (PostgreSQL's backends leave the
        group) and processes carrying the instance marker."""
        pids: set[int] = set()
        for name in names:
            proc = self._procs[name]
            pids.update(group_pids(proc.pid))
            if alive(proc.pid):
                pids.add(proc.pid)
                pids.update(descendants(proc.pid))
            if self._token:
                pids.update(marked_pids(self._token, name))
        return sorted(pids)

    def _stop(
        self, names: list[str], grace: float, sig: int | None = None, seen: Collection[int] = ()
    ) -> list[int]:
        """Signal ``names`` (``sig``, default SIGINT for PostgreSQL: fast shutdown; SIGTERM
        otherwise), wait up to ``grace`` s, then SIGKILL what is left, including processes seen
        before (``seen``: orphans lose their parent and group); the PIDs that needed SIGKILL."""
        procs = [self._procs[n] for n in names if n in self._procs]
        by_name = {n: set(self._pids_of([n])) for n in names if n in self._procs}
        snapshot = set(seen).union(*by_name.values())
        for proc in procs:
            kind = self.instance(proc.name).spec.kind if proc.name in self.names() else ""
            default = _STOP_SIGNALS.get(kind, signal.SIGTERM)
            signal_group(proc.pid, sig if sig is not None else default)

        def left() -> list[int]:
            return sorted({p for p in snapshot if alive(p)} | set(self._pids_of(names)))

        if wait_gone(left, grace, reap=procs):
            return []
        self.forced += [n for n, pids in by_name.items() if any(alive(p) for p in pids) or self._pids_of([n])]
        killed: list[int] = []
        for _ in range(5):
            remaining = left()
            if not remaining:
                break
            for proc in procs:
                signal_group(proc.pid, signal.SIGKILL)
            for pid in remaining:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            wait_gone(left, 2.0, reap=procs)
        return sorted(set(killed))

    def down(self) -> list[str]:
        """Stop every process this cluster started (what uses the databases first, then them) and
        every straggler carrying the cluster's marker; the names that were running."""
        was_running = self.running()
        infra = [n for n in self._procs if n in self.names() and self.instance(n).spec.kind in _INFRA_KINDS]
        rest = [n for n in self._procs if n not in infra]
        self._stop(rest[::-1], grace=30.0 * self.timeout_scale)
        self._stop(infra[::-1], grace=30.0 * self.timeout_scale)
        if self._token:
            for _ in range(5):
                left = marked_pids(self._token)
                if not left:
                    break
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.3)
        with contextlib.suppress(FileNotFoundError):
            self.state_file.unlink()
        return was_running

    def status(self) -> list[ProcessStatus]:
        """Each recorded process: alive or not, its PIDs and memory."""
        out = []
        for name, proc in self._procs.items():
            pids = self._pids_of([name])
            ports = self.instance(name).ports if name in self.names() else {}
            out.append(
                ProcessStatus(
                    name=name,
                    pid=proc.pid,
                    alive=bool(pids),
                    pids=len(pids),
                    rss_mib=rss_kib(pids) / 1024,
                    ports=ports,
                    log=proc.log,
                )
            )
        return out

    def pids(self, name: str) -> list[int]:
        """The live PIDs of process ``name`` (its group and marked children)."""
        return self._pids_of([self.instance(name).name]) if name in self._procs else []

    def describe(self) -> dict[str, Any]:
        """The UIs and endpoints a user opens, for the start-up summary."""
        out: dict[str, Any] = {}
        names = self.names()
        if "airflow-api-server" in names:
            admin = self.topology.settings["AIRFLOW_ADMIN_USER"]
            out["Airflow UI"] = (
                f"{self.url('airflow-api-server')}  (user {admin}, password in docker/stack.env)"
            )
        if "spark-master" in names:
            out["Spark master"] = f"{self.url('spark-master')}  UI {self.url('spark-master', 'ui')}"
        if "minio" in names:
            bucket = self.topology.settings["BUCKET"]
            out["MinIO"] = f"{self.url('minio')} (bucket {bucket})  console {self.url('minio', 'console')}"
        if "mailpit" in names:
            out["SMTP catcher"] = f"{self.url('mailpit')}  inbox {self.mail_dir}/*.eml"
        commit = [n for n in names if n.startswith("commit-service")]
        if commit:
            out["Commit service"] = (
                "  ".join(self.url(n) for n in commit) + f"  (token in {self.root / 'secrets.env'})"
            )
        out["Client environment"] = f". {self.root / 'env'}"
        return out
