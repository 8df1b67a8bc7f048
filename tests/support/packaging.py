"""The package as a user gets it: its wheel, fresh virtualenvs, and the rule on its requirements.

- ``build_wheel``: the wheel of a copy of the sources (pyproject.toml, README.md, include/), so the
  build leaves no ``delta_mirror.egg-info`` in the working tree, where it would be a second
  distribution on the development venv's path.
- ``Venv``: a fresh virtualenv, pip's cache reused (never ``--no-cache-dir``), installs constrained
  to the development venv's versions (``dev_constraints``): the wheels are in pip's cache already
  and the resolution is the one CI tests, not whatever was published this morning.
- ``capped_tighter_than``: the requirements of ours that exclude a version another distribution
  (Airflow) allows above our own lower bound: a user's Airflow must never be pinned by ours.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from email.parser import Parser
from importlib.metadata import requires
from pathlib import Path
from zipfile import ZipFile

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
#: What the wheel is built from (the jars stay out: 75 MB to compress that no check here reads).
SOURCES = ("pyproject.toml", "README.md", "include")
#: The outer environment's settings that would make a fresh venv less fresh.
FOREIGN = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV", "PIP_USER")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without Python path settings, ``AIRFLOW*`` and ``DELTA_MIRROR_*``, plus ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in FOREIGN and not k.startswith(("AIRFLOW", "DELTA_MIRROR_", "AWS_"))
    }
    env.update(extra)
    return env


def run(argv: Sequence[str], *, timeout: float, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``argv`` to completion, its output kept; a failure shows both streams."""
    kwargs.setdefault("env", clean_env())
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kwargs)  # type: ignore[call-overload]
    assert isinstance(out, subprocess.CompletedProcess)
    return out


def checked(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, (
        f"{out.args} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    )
    return out.stdout


def build_wheel(dest: Path) -> Path:
    """The project's wheel (``pip wheel --no-deps``), built from a copy of its sources under ``dest``."""
    src = dest / "src"
    src.mkdir(parents=True)
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(
                path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.jar")
            )
        else:
            shutil.copy2(path, src / name)
    out_dir = dest / "dist"
    checked(
        run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out_dir), str(src)],
            timeout=600,
        )
    )
    (wheel,) = out_dir.glob("delta_mirror-*.whl")
    return wheel


def wheel_metadata(wheel: Path) -> dict[str, list[str]]:
    """The wheel's METADATA headers (each a list: ``Requires-Dist`` repeats)."""
    with ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(zf.read(name).decode("utf-8"))
    out: dict[str, list[str]] = {}
    for key, value in message.items():
        out.setdefault(key, []).append(value)
    return out


def wheel_entry_points(wheel: Path) -> str:
    with ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt")]
        return zf.read(name).decode("utf-8")


def dev_constraints(dest: Path) -> Path:
    """The development venv's versions (``pip freeze``) as a constraints file."""
    frozen = checked(run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], timeout=300))
    lines = [line for line in frozen.splitlines() if "==" in line and " @ " not in line]
    path = dest / "constraints.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class Venv:
    """A fresh virtualenv at ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        checked(run([sys.executable, "-m", "venv", str(path)], timeout=300))
        self.bin = path / "bin"
        self.python = str(self.bin / "python")

    def pip(self, *args: str, timeout: float = 1800) -> str:
        return checked(run([self.python, "-m", "pip", "--disable-pip-version-check", *args], timeout=timeout))

    def run(
        self, *argv: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A command of this venv's ``bin/`` (``python``, ``airflow``, ``delta-mirror``)."""
        return run(
            [str(self.bin / argv[0]), *argv[1:]],
            timeout=600,
            env=dict(env or clean_env()),
            cwd=cwd or self.path,
        )

    def site_packages(self) -> Path:
        return Path(
            checked(
                self.run("python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
            ).strip()
        )


# --------------------------------------------------------------------------------------------------
# the rule: no cap tighter than Airflow's

#: Whose requirements ours must leave every version of (installed in the development venv).
AIRFLOW_DISTRIBUTIONS = ("apache-airflow-core", "apache-airflow-task-sdk")


def airflow_requirements() -> list[str]:
    """The ``Requires-Dist`` lines of the installed Airflow core and task SDK."""
    lines: list[str] = []
    for dist in AIRFLOW_DISTRIBUTIONS:
        lines += requires(dist) or []
    assert any(line.startswith("uvicorn") for line in lines), "apache-airflow-core should require uvicorn"
    return lines


def _versions_in(spec: SpecifierSet) -> list[Version]:
    return [Version(s.version.removesuffix(".*")) for s in spec]


def _neighbours(v: Version) -> list[Version]:
    """``v`` and the next micro, minor and major releases after it: where a cap shows."""
    major, minor, micro = [*v.release, 0, 0, 0][:3]
    return [
        v,
        Version(f"{major}.{minor}.{micro + 1}"),
        Version(f"{major}.{minor + 1}"),
        Version(f"{major + 1}"),
    ]


def _lower_bound(spec: SpecifierSet) -> Version | None:
    lows = [
        Version(s.version.removesuffix(".*")) for s in spec if s.operator in (">=", ">", "==", "~=", "===")
    ]
    return max(lows) if lows else None


def excluded_versions(ours: SpecifierSet, theirs: SpecifierSet) -> list[Version]:
    """Versions ``theirs`` allows, at or above our lower bound, that ``ours`` refuses (final releases
    only; probed at each version either set names, the releases just after it, and a far one)."""
    probes = {p for v in _versions_in(ours) + _versions_in(theirs) for p in _neighbours(v)}
    probes.add(Version("10000"))
    low = _lower_bound(ours)
    return sorted(
        v for v in probes if (low is None or v >= low) and theirs.contains(v) and not ours.contains(v)
    )


def _applies(req: Requirement, extras: Iterable[str]) -> bool:
    if req.marker is None:
        return True
    env: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    return any(req.marker.evaluate({**env, "extra": extra}) for extra in ("", *extras))


def requirements_by_name(lines: Iterable[str], extras: Iterable[str] = ()) -> dict[str, list[Requirement]]:
    """``Requires-Dist`` lines that apply here (base, or one of ``extras``), by canonical name."""
    out: dict[str, list[Requirement]] = {}
    wanted = tuple(extras)
    for line in lines:
        req = Requirement(line)
        if _applies(req, wanted):
            out.setdefault(canonicalize_name(req.name), []).append(req)
    return out


def capped_tighter_than(ours: Iterable[str], theirs: Iterable[str], our_extras: Iterable[str]) -> list[str]:
    """Each requirement of ours (any extra) on a distribution that ``theirs`` (base requirements) also
    names, which refuses a version theirs allows above our lower bound: ``"uvicorn<0.55 refuses 0.55
    that apache-airflow-core allows (uvicorn>=0.37.0)"``."""
    mine = requirements_by_name(ours, our_extras)
    other = requirements_by_name(theirs)
    problems = []
    for name in sorted(mine.keys() & other.keys()):
        their_spec = SpecifierSet(",".join(str(r.specifier) for r in other[name] if str(r.specifier)))
        for req in mine[name]:
            refused = excluded_versions(req.specifier, their_spec)
            if refused:
                problems.append(
                    f"{req.name}{req.specifier} refuses {', '.join(map(str, refused))}, allowed by "
                    f"{name}{their_spec or ' (any version)'}"
                )
    return problems


__all__ = [
    "AIRFLOW_DISTRIBUTIONS",
    "REPO",
    "Venv",
    "airflow_requirements",
    "build_wheel",
    "capped_tighter_than",
    "checked",
    "clean_env",
    "dev_constraints",
    "excluded_versions",
    "requirements_by_name",
    "run",
    "wheel_entry_points",
    "wheel_metadata",
]
