"""``delta-mirror jar``: the path of a jar shipped in the package (for ``spark-submit --jars``) and the
Maven coordinates it was built as (for ``--packages``), read from the jar itself; one error line
when there is no jar or it is not one Maven built."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from delta_mirror.cli import cli
from delta_mirror.jobs.validate.kernel_java import JAR_ENV as KERNEL_JAR_ENV
from delta_mirror.spark.session import LOGSTORE_JAR_ENV, LogStoreJarMissing, logstore_jar


def fake_jar(path: Path, artifact: str | None, version: str = "9.8.7") -> Path:
    """A zip with Maven's pom.properties for ``io.github.deltamirror:<artifact>:<version>`` (None: without)."""
    with zipfile.ZipFile(path, "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        if artifact:
            jar.writestr(
                f"META-INF/maven/io.github.deltamirror/{artifact}/pom.properties",
                f"#Created by Apache Maven\nartifactId={artifact}\ngroupId=io.github.deltamirror\nversion={version}\n",
            )
    return path


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["jar", *args])
    return result.exit_code, result.stdout, result.stderr


def test_prints_the_logstore_jar_the_package_uses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    jar = fake_jar(tmp_path / "logstore.jar", "delta-mirror-logstore")
    monkeypatch.setenv(LOGSTORE_JAR_ENV, str(jar))
    assert run() == (0, f"{jar.resolve()}\n", "")
    assert run("logstore", "--coordinates") == (0, "io.github.deltamirror:delta-mirror-logstore:9.8.7\n", "")


def test_prints_the_kernel_reader_jar_and_its_coordinates(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    jar = fake_jar(tmp_path / "reader.jar", "delta-mirror-kernel-reader", "1.2.3")
    monkeypatch.setenv(KERNEL_JAR_ENV, str(jar))
    assert run("kernel-reader") == (0, f"{jar.resolve()}\n", "")
    assert run("kernel-reader", "--coordinates") == (
        0,
        "io.github.deltamirror:delta-mirror-kernel-reader:1.2.3\n",
        "",
    )


def test_without_the_variable_the_logstore_jar_is_where_make_jar_puts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The package's own path is the Makefile's ``LOGSTORE_JAR`` (a module move once left it
    pointing at ``spark/spark/jars``, and every Spark test that needs the jar skipped or failed)."""
    import re

    root = Path(__file__).resolve().parents[1]
    makefile = (root / "Makefile").read_text(encoding="utf-8")
    built = re.search(r"^LOGSTORE_JAR\s*:=\s*(\S+)", makefile, re.M)
    assert built is not None
    monkeypatch.delenv(LOGSTORE_JAR_ENV, raising=False)
    expected = (root / built.group(1)).resolve()
    if expected.is_file():
        assert logstore_jar() == expected
    else:
        with pytest.raises(LogStoreJarMissing, match=re.escape(str(expected))):
            logstore_jar()


def test_the_built_logstore_jar_is_the_package_s_own() -> None:
    try:
        jar = logstore_jar()
    except LogStoreJarMissing:
        pytest.skip("the LogStore jar is not built (`make jar` needs Maven and a JDK 17)")
    from delta_mirror.version import __version__

    code, out, _ = run("--coordinates")
    assert (code, out) == (0, f"io.github.deltamirror:delta-mirror-logstore:{__version__}\n")
    assert run()[1] == f"{jar.resolve()}\n"


@pytest.mark.parametrize(
    ("name", "env"),
    [("logstore", LOGSTORE_JAR_ENV), ("kernel-reader", KERNEL_JAR_ENV)],
    ids=["logstore", "kernel"],
)
def test_a_missing_jar_is_one_line_naming_the_make_target(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, env: str
) -> None:
    monkeypatch.setenv(env, str(tmp_path / "nowhere.jar"))
    code, out, err = run(name)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert ("`make jar`" if name == "logstore" else "`make kernel-jar`") in err


def test_a_jar_not_built_by_maven_or_not_a_jar_is_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(LOGSTORE_JAR_ENV, str(fake_jar(tmp_path / "plain.jar", None)))
    code, out, err = run("--coordinates")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and "has no Maven pom.properties for delta-mirror-logstore" in err
    # the path alone is printed without opening it
    assert run()[0] == 0

    not_zip = tmp_path / "text.jar"
    not_zip.write_text("not a zip")
    monkeypatch.setenv(LOGSTORE_JAR_ENV, str(not_zip))
    code, out, err = run("--coordinates")
    assert (code, out) == (1, "")
    assert err.count("\n") == 1 and "is not a readable jar" in err


def test_an_unknown_jar_name_is_a_usage_error() -> None:
    code, _, err = run("spark")
    assert code == 2 and "'spark' is not one of" in err
