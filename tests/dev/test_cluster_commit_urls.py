"""``.cluster/env`` and the cluster's Airflow processes name every commit-service replica in the one
variable ``DELTA_MIRROR_COMMIT_URL`` (issue 40: it named replica 1 only, both replicas only in the
undocumented ``DELTA_MIRROR_COMMIT_URLS``), which ``get_spark()`` and the Airflow hook read."""

from __future__ import annotations

from pathlib import Path

from delta_mirror.dev.cluster import Cluster, default_repo
from delta_mirror.spark.session import AuthorityConfig


def test_the_client_and_airflow_environments_list_both_replicas_in_the_one_variable(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "cl", repo=default_repo(), port_base=30000, commit_replicas=2)
    both = f"{cluster.url('commit-service-1')},{cluster.url('commit-service-2')}"
    stack = cluster.stack()
    for env in (stack.client_env(2), stack.airflow_env(2)):
        assert env["DELTA_MIRROR_COMMIT_URL"] == both
        assert "DELTA_MIRROR_COMMIT_URLS" not in env
        authority = AuthorityConfig.from_env(env)
        assert authority is not None and authority.url == both
