"""What every delta-mirror operator shares, whatever Airflow class it extends.

One mixin carries the connection arguments, the template fields they add and the hook built from
them; ``DeltaMirrorBaseOperator`` mixes it into ``BaseOperator``, the Spark checkpoint step into
``SparkSubmitOperator``. A test checks that every exported operator has it.
"""

from __future__ import annotations

from functools import cached_property

from delta_mirror.airflow.hooks import DeltaMirrorHook

#: Templated on every operator: the backfill form picks the table, and with it the table's
#: connections, at run time.
CONNECTION_FIELDS: tuple[str, ...] = ("store_conn_id", "aws_conn_id")


def template_fields_with(*fields: str) -> tuple[str, ...]:
    """The shared connection fields followed by an operator's own, each once."""
    return tuple(dict.fromkeys((*CONNECTION_FIELDS, *fields)))


class DeltaMirrorHookMixin:
    """``store_conn_id`` (a Postgres connection; none: ``DELTA_MIRROR_STORE`` or the embedded
    SQLite store) and ``aws_conn_id`` (S3 credentials and endpoint; none: the AWS environment),
    and the ``hook`` over them. The operator's constructor assigns both ids."""

    store_conn_id: str | None
    aws_conn_id: str | None

    @cached_property
    def hook(self) -> DeltaMirrorHook:
        """Built on first use, after Airflow has rendered the templated connection ids."""
        return DeltaMirrorHook(store_conn_id=self.store_conn_id, aws_conn_id=self.aws_conn_id)


__all__ = ["CONNECTION_FIELDS", "DeltaMirrorHookMixin", "template_fields_with"]
