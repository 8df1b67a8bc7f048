"""``delta-mirror jar``: where the jars shipped in the package are, for ``spark-submit --jars``.

The LogStore jar (Spark writers through the commit service) and the delta-kernel-java reader are
package data (``make jar`` / ``make kernel-jar`` put them there; a wheel from ``make dist`` carries
them). ``--coordinates`` prints the Maven coordinates the jar was built under (its own
``META-INF/maven/<group>/<artifact>/pom.properties``), the ones ``make jar`` installs into the local
Maven repository and a team deploys to its own repository for ``--packages`` (docs/spark-jars.md).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import click

from delta_mirror.cli.common import Ctx, errors
from delta_mirror.errors import PermanentError

#: jar name on the command line → the Maven artifactId it is built as (jvm/<module>/pom.xml)
ARTIFACTS = {"logstore": "delta-mirror-logstore", "kernel-reader": "delta-mirror-kernel-reader"}


def jar_path(name: str) -> Path:
    """The jar the package uses for ``name`` (its ``DELTA_MIRROR_*_JAR`` override included)."""
    if name == "logstore":
        from delta_mirror.spark.session import logstore_jar

        return logstore_jar()  # LogStoreJarMissing (a PermanentError) names `make jar`
    from delta_mirror.jobs.validate.kernel_java import JAR_ENV, JAR_NAME, kernel_jar

    path = kernel_jar()
    if path is None:
        raise PermanentError(
            f"the delta-kernel-java reader jar ({JAR_NAME}) is not built here nor named by ${JAR_ENV}",
            hint="run `make kernel-jar` in a checkout (needs Maven and a JDK 17), or install a wheel built by `make dist`",
        )
    return path


def maven_coordinates(jar: Path, artifact_id: str) -> str:
    """``group:artifact:version`` from the jar's own ``pom.properties`` (written by Maven's jar plugin)."""
    try:
        with zipfile.ZipFile(jar) as archive:
            names = [
                n
                for n in archive.namelist()
                if n.startswith("META-INF/maven/") and n.endswith(f"/{artifact_id}/pom.properties")
            ]
            text = archive.read(names[0]).decode("utf-8") if names else ""
    except (OSError, zipfile.BadZipFile) as exc:
        raise PermanentError(f"{jar} is not a readable jar ({exc})") from exc
    props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    if not all(props.get(k) for k in ("groupId", "artifactId", "version")):
        raise PermanentError(
            f"{jar} has no Maven pom.properties for {artifact_id}",
            hint="it was not built by jvm/*/pom.xml: rebuild it with `make jar` / `make kernel-jar`",
        )
    return f"{props['groupId'].strip()}:{props['artifactId'].strip()}:{props['version'].strip()}"


@click.command("jar", short_help="Print a packaged jar's path or coordinates.")
@click.argument("name", type=click.Choice(sorted(ARTIFACTS)), default="logstore")
@click.option(
    "--coordinates",
    is_flag=True,
    help="Print the Maven coordinates (group:artifact:version) it was built as, for --packages.",
)
@click.pass_obj
def jar(ctx: Ctx, name: str, coordinates: bool) -> None:
    """Print the path of a jar shipped in the package (default: the LogStore, for spark-submit --jars).

    NAME is logstore (Spark writers through the commit service) or kernel-reader (delta-kernel-java).
    """
    with errors(ctx):
        path = jar_path(name).resolve()
        click.echo(maven_coordinates(path, ARTIFACTS[name]) if coordinates else str(path))


__all__ = ["ARTIFACTS", "jar", "jar_path", "maven_coordinates"]
