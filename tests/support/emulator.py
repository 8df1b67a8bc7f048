"""The one shape every storage emulator the tests start shares (Azurite, fake-gcs-server and its
upload front, MinIO): a binary found or a clear "not found", a work folder with one log, each
process in its own group, a readiness wait that fails at once when a process dies (and cleans up),
and a stop that kills the groups and removes the folder.

Why one helper: the three servers were started and stopped by three copies of the same dozen
lines, and a fix to one (say, how a dead process is reported) missed the others.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from support.services import ServiceUnavailable, exit_report, file_tail, find_tool, stop_group
from support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]


def require_binary(env_var: str, local: Path, name: str, label: str) -> str:
    """The emulator's executable (see ``find_tool``), or ``ServiceUnavailable`` naming ``label``
    and how to install it (the session fixture turns that into a skip, or a failure under CI)."""
    binary = find_tool(env_var, local, name)
    if binary is None:
        raise ServiceUnavailable(
            f"{label} not found: run scripts/install-emulators.sh (make test does) or set {env_var}"
        )
    return binary


class EmulatorProcesses:
    """The processes of one emulator: started in ``workdir`` with their output in one log."""

    def __init__(self, name: str) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"dm-{name}-"))
        self.log_path = self.workdir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self, *argv: str, env: Mapping[str, str] | None = None) -> None:
        """One more process, in its own process group (so ``stop`` ends its children too)."""
        self._procs.append(
            subprocess.Popen(
                list(argv),
                cwd=self.workdir,
                env=None if env is None else {**os.environ, **env},
                stdout=self._log,
                stderr=self._log,
                start_new_session=True,
            )
        )

    def wait(self, check: Callable[[], bool], seconds: float, what: str, interval: float = 0.1) -> None:
        """Poll ``check`` (the wait scales with the load); a process that dies fails it at once with
        its exit code and log. On any failure everything is stopped before the error goes up."""
        try:
            wait_until(check, seconds, what, interval=interval, alive=self.exited)
        except BaseException:
            self.stop()
            raise

    def exited(self) -> str | None:
        """None while every process runs, else the first dead one's exit code and the log's end."""
        return exit_report(self._procs, self.log_path)

    def log_tail(self) -> str:
        return file_tail(self.log_path)

    def stop(self, grace: float = 0.0) -> None:
        """Each group SIGTERMed with ``grace`` seconds to go, else (or then) SIGKILLed; the folder goes."""
        for proc in self._procs:
            stop_group(proc, grace=grace)
        self._log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


__all__ = ["REPO", "EmulatorProcesses", "require_binary"]
