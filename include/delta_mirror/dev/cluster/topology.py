"""The stack's topology as the process launcher reads it: docker/stack.env + docker/stack.yaml.

docker-compose.yaml starts the same services from the same two files, so a setting changed there
changes both launchers. This module only parses and checks; it starts nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "KINDS",
    "ServiceSpec",
    "Topology",
    "TopologyError",
    "load_topology",
    "parse_env",
    "parse_topology",
]

KINDS = frozenset(
    {
        "postgres",
        "redis",
        "minio",
        "smtp",
        "airflow-init",
        "airflow",
        "spark-master",
        "spark-worker",
        "commit-service",
    }
)
_KEY = re.compile(r"[A-Z_][A-Z0-9_]*")


class TopologyError(ValueError):
    """docker/stack.env or docker/stack.yaml is malformed: the message names the file and the line."""


@dataclass(frozen=True)
class ServiceSpec:
    """One entry of stack.yaml's ``services``: ``replicas`` copies of one kind of process."""

    name: str
    kind: str
    command: tuple[str, ...] = ()
    ports: Mapping[str, str] = field(default_factory=dict)  # role -> port key of stack.env
    replicas: int = 1
    after: tuple[str, ...] = ()
    oneshot: bool = False
    compose_only: tuple[str, ...] = ()  # port roles only the Compose launcher has

    def instance_names(self, replicas: int | None = None) -> list[str]:
        """The process names: the service name, or ``<name>-1 ... <name>-N`` for a replicated one."""
        count = self.replicas if replicas is None else replicas
        if self.replicas == 1 and count == 1:
            return [self.name]
        return [f"{self.name}-{i}" for i in range(1, count + 1)]


@dataclass(frozen=True)
class Topology:
    """Settings (stack.env, in file order) and services (stack.yaml, in start order)."""

    settings: Mapping[str, str]
    port_slots: Mapping[str, int]  # port key -> consecutive ports it reserves, in port-base order
    services: Mapping[str, ServiceSpec]

    def ports(self, port_base: int | None = None) -> dict[str, int]:
        """The first port of each port key: stack.env's value, or packed from ``port_base`` on."""
        if port_base is None:
            return {key: int(self.settings[key]) for key in self.port_slots}
        if not 1024 <= port_base <= 65535 - sum(self.port_slots.values()):
            raise TopologyError(
                f"port base {port_base} out of range: the cluster needs {sum(self.port_slots.values())} "
                "consecutive ports between 1024 and 65535"
            )
        out: dict[str, int] = {}
        nxt = port_base
        for key, slots in self.port_slots.items():
            out[key] = nxt
            nxt += slots
        return out

    def airflow_options(self) -> dict[str, str]:
        """The ``AIRFLOW__SECTION__KEY`` options every Airflow process gets."""
        return {k: v for k, v in self.settings.items() if k.startswith("AIRFLOW__")}


def parse_env(text: str, source: str = "stack.env") -> dict[str, str]:
    """KEY=VALUE lines (``#`` comments, blank lines); no quotes, no expansion, no duplicate keys."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _KEY.fullmatch(key):
            raise TopologyError(f"{source}:{number}: expected KEY=VALUE (KEY in A-Z0-9_), got {raw!r}")
        if key in out:
            raise TopologyError(f"{source}:{number}: {key} is set twice")
        if value[:1] in ("'", '"') or "${" in value:
            raise TopologyError(
                f"{source}:{number}: {key}: no quotes or ${{...}} (both launchers read it raw)"
            )
        out[key] = value
    return out


def _service(name: str, raw: Any, settings: Mapping[str, str], slots: Mapping[str, int]) -> ServiceSpec:
    where = f"stack.yaml: service {name}"
    if not isinstance(raw, dict):
        raise TopologyError(f"{where}: expected a mapping")
    unknown = set(raw) - {"kind", "command", "ports", "replicas", "after", "oneshot", "compose_only"}
    if unknown:
        raise TopologyError(f"{where}: unknown field(s) {sorted(unknown)}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise TopologyError(f"{where}: kind {kind!r} is not one of {sorted(KINDS)}")
    ports = raw.get("ports") or {}
    if not isinstance(ports, dict):
        raise TopologyError(f"{where}: ports must map a role to a port key")
    replicas = raw.get("replicas", 1)
    if not isinstance(replicas, int) or replicas < 1:
        raise TopologyError(f"{where}: replicas must be a positive integer, got {replicas!r}")
    for role, key in ports.items():
        if key not in slots:
            raise TopologyError(f"{where}: port {role} -> {key}, which is not in stack.yaml's ports list")
        if key not in settings or not settings[key].isdigit():
            raise TopologyError(f"{where}: port key {key} has no numeric value in stack.env")
        if slots[key] < replicas:
            raise TopologyError(f"{where}: {replicas} replicas but {key} reserves {slots[key]} port(s)")
    return ServiceSpec(
        name=name,
        kind=kind,
        command=tuple(str(c) for c in raw.get("command") or ()),
        ports={str(r): str(k) for r, k in ports.items()},
        replicas=replicas,
        after=tuple(raw.get("after") or ()),
        oneshot=bool(raw.get("oneshot", False)),
        compose_only=tuple(raw.get("compose_only") or ()),
    )


def parse_topology(env_text: str, yaml_text: str) -> Topology:
    """Both files' text to a checked Topology (every name it refers to exists)."""
    settings = parse_env(env_text)
    try:
        doc = yaml.safe_load(yaml_text)
    except yaml.YAMLError as exc:
        raise TopologyError(f"stack.yaml: not valid YAML: {exc}".splitlines()[0]) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise TopologyError("stack.yaml: expected top-level 'ports' and 'services' mappings")
    slots_raw = doc.get("ports") or {}
    if not isinstance(slots_raw, dict) or not all(isinstance(v, int) and v > 0 for v in slots_raw.values()):
        raise TopologyError("stack.yaml: ports must map each port key to a positive count")
    slots = {str(k): int(v) for k, v in slots_raw.items()}
    services = {str(n): _service(str(n), raw, settings, slots) for n, raw in doc["services"].items()}
    for spec in services.values():
        for dep in spec.after:
            if dep not in services:
                raise TopologyError(f"stack.yaml: service {spec.name}: after {dep!r}, which is not a service")
            if list(services).index(dep) > list(services).index(spec.name):
                raise TopologyError(f"stack.yaml: service {spec.name} is listed before {dep}, which it needs")
    return Topology(settings=settings, port_slots=slots, services=services)


def load_topology(docker_dir: Path) -> Topology:
    """docker/stack.env and docker/stack.yaml of a checkout."""
    try:
        env_text = (docker_dir / "stack.env").read_text()
        yaml_text = (docker_dir / "stack.yaml").read_text()
    except OSError as exc:
        raise TopologyError(f"cannot read the stack topology: {exc}") from None
    return parse_topology(env_text, yaml_text)
