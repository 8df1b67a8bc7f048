"""``make dist``: the wheel and the sdist carry both jars, built as the package's version; ``make jar``
and ``make kernel-jar`` install them into the local Maven repository under those coordinates.

One ``make jar kernel-jar dist`` for the module (about 40 s: two isolated build environments and a
75 MB reader jar written twice). The jars are not rebuilt here (``make -o``): a checkout without
Maven has none and the tests skip saying so; jars that predate a version change fail the version
check, which names ``make jar kernel-jar``. The Maven install runs only when the repository lacks it.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import tarfile
import tomllib
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GROUP = "io.github.deltamirror"
#: artifactId → the jar's place in the package (pyproject's package-data, the Makefile's LOGSTORE_JAR/KERNEL_JAR)
JARS = {
    "delta-mirror-logstore": "delta_mirror/spark/jars/delta-mirror-logstore.jar",
    "delta-mirror-kernel-reader": "delta_mirror/jobs/validate/jars/delta-mirror-kernel-reader.jar",
}
#: the Makefile's default M2_REPO
LOCAL_MAVEN_REPO = ROOT / ".cache" / "m2"
POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def package_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def built_jar(artifact: str) -> Path:
    return ROOT / "include" / JARS[artifact]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def pom_properties(jar_bytes: bytes, artifact: str) -> dict[str, str]:
    """The jar's ``META-INF/maven/<group>/<artifact>/pom.properties`` (Maven's jar plugin writes it)."""
    with zipfile.ZipFile(io.BytesIO(jar_bytes)) as jar:
        text = jar.read(f"META-INF/maven/{GROUP}/{artifact}/pom.properties").decode("utf-8")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [str(built_jar(a).relative_to(ROOT)) for a in JARS if not built_jar(a).is_file()]
    if missing:
        pytest.skip(f"not built: {', '.join(missing)} (`make jar kernel-jar` needs Maven and a JDK 17)")
    out = tmp_path_factory.mktemp("dist")
    # the Makefile's defaults (M2_REPO: .cache/m2), not a caller's make settings
    env = {k: v for k, v in os.environ.items() if k not in ("M2_REPO", "DIST_DIR", "MAKEFLAGS", "MAKELEVEL")}
    keep = [arg for a in JARS for arg in ("-o", str(built_jar(a).relative_to(ROOT)))]
    proc = subprocess.run(
        ["make", "-s", *keep, "jar", "kernel-jar", "dist", f"DIST_DIR={out}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"make dist failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return out


def only(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    assert len(found) == 1, f"{pattern}: {[p.name for p in found]}"
    return found[0]


def test_the_wheel_carries_both_jars_built_as_the_package_version(dist: Path) -> None:
    version = package_version()
    wheel = only(dist, "*.whl")
    assert wheel.name == f"delta_mirror-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        metadata = whl.read(f"delta_mirror-{version}.dist-info/METADATA").decode("utf-8")
        assert f"\nVersion: {version}\n" in metadata
        for artifact, place in JARS.items():
            assert place in names, f"{place} is not in {wheel.name}"
            data = whl.read(place)
            assert sha256(data) == sha256(built_jar(artifact).read_bytes()), f"{place} is not the built jar"
            assert pom_properties(data, artifact) == {
                "groupId": GROUP,
                "artifactId": artifact,
                "version": version,
            }, f"{place} was not built as {GROUP}:{artifact}:{version}: run `make jar kernel-jar`"
    assert sorted(n for n in names if n.endswith(".jar")) == sorted(JARS.values()), (
        "no other jar in the wheel"
    )


def test_the_sdist_carries_both_jars_and_their_sources(dist: Path) -> None:
    version = package_version()
    sdist = only(dist, "*.tar.gz")
    assert sdist.name == f"delta_mirror-{version}.tar.gz"
    top = f"delta_mirror-{version}"
    jars: dict[str, str] = {}
    with tarfile.open(sdist) as tar:
        names = set()
        for member in tar:  # one pass over the gzip stream
            names.add(member.name)
            if member.name.endswith(".jar"):
                fileobj = tar.extractfile(member)
                assert fileobj is not None, member.name
                jars[member.name] = sha256(fileobj.read())
    assert jars == {f"{top}/include/{place}": sha256(built_jar(a).read_bytes()) for a, place in JARS.items()}
    for source in (
        "jvm/logstore/pom.xml",
        "jvm/logstore/src/main/java/io/github/deltamirror/logstore/SqlAuthorityLogStore.java",
        "jvm/kernel-reader/pom.xml",
        "jvm/kernel-reader/src/main/java/io/github/deltamirror/kernelreader/KernelReader.java",
    ):
        assert f"{top}/{source}" in names, f"{source} is not in the sdist (MANIFEST.in)"
    assert f"{top}/pyproject.toml" in names


def test_make_jar_installed_both_into_the_local_maven_repository(dist: Path) -> None:
    version = package_version()
    for artifact in JARS:
        folder = LOCAL_MAVEN_REPO / GROUP.replace(".", "/") / artifact / version
        jar = folder / f"{artifact}-{version}.jar"
        assert jar.is_file(), f"{jar} is missing"
        assert sha256(jar.read_bytes()) == sha256(built_jar(artifact).read_bytes()), (
            f"{jar} is not the built jar"
        )
        pom = ET.parse(folder / f"{artifact}-{version}.pom").getroot()
        coordinates = {
            k: pom.findtext(f"m:{k}", namespaces=POM_NS) for k in ("groupId", "artifactId", "version")
        }
        assert coordinates == {"groupId": GROUP, "artifactId": artifact, "version": version}
        assert pom.findtext("m:packaging", namespaces=POM_NS) == "jar"
        # the LogStore's dependencies are Spark's own, the kernel reader's are inside it
        assert pom.find("m:dependencies", POM_NS) is None


def test_dist_leaves_no_build_metadata_on_the_import_path(dist: Path) -> None:
    # include/ is on sys.path (editable install): a delta_mirror.egg-info there is a second distribution
    assert not (ROOT / "include" / "delta_mirror.egg-info").exists()
