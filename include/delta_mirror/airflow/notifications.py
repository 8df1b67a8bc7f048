"""Who is told what: deadline misses, lag SLO breaches, persistent failures, task failures.

Email goes through the SMTP provider's ``SmtpNotifier`` (the table's ``smtp_conn_id``); a table
may instead name any Airflow notifier class by import path (e.g. Slack), built with its kwargs.
Without that connection (the local ``make airflow``) an alert is one log line saying what would have
gone to whom, not a traceback "SMTP connection is not found".
"""

from __future__ import annotations

import html
import importlib
import logging
from typing import Any

from delta_mirror.table_config import Notify


def build_notifier(notify: Notify, subject: str, body: str) -> Any:
    """A notifier instance for this table's channel (``notify()`` / ``async_notify()``)."""
    if notify.notifier:
        module, _, name = notify.notifier.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        kwargs = dict(notify.notifier_kwargs)
        if "text" in getattr(cls, "template_fields", ()):
            kwargs.setdefault("text", f"{subject}\n{body}")
        return cls(**kwargs)
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    return SmtpNotifier(
        to=list(notify.email),
        from_email=notify.from_email,
        subject=subject,
        html_content=f"<pre>{html.escape(body)}</pre>",
        smtp_conn_id=notify.smtp_conn_id,
    )


log = logging.getLogger(__name__)


def _not_sent(notify: Notify, subject: str) -> None:
    log.warning(
        "no mail connection '%s': the alert \"%s\" to %s was not sent (set AIRFLOW_CONN_%s to an SMTP URL, "
        "docs/airflow.md: Alerts)",
        notify.smtp_conn_id,
        subject,
        ", ".join(notify.email),
        notify.smtp_conn_id.upper(),
    )


def _mail_connection_missing(notify: Notify) -> bool:
    """True when email is the channel and its connection is not defined (checked before sending)."""
    if notify.notifier:
        return False
    from airflow.providers.common.compat.sdk import AirflowNotFoundException, BaseHook

    try:
        BaseHook.get_connection(notify.smtp_conn_id)
    except AirflowNotFoundException:
        return True
    return False


async def _amail_connection_missing(notify: Notify) -> bool:
    if notify.notifier:
        return False
    from airflow.providers.common.compat.sdk import AirflowNotFoundException, BaseHook

    try:
        await BaseHook.aget_connection(notify.smtp_conn_id)
    except AirflowNotFoundException:
        return True
    return False


def send(notify: Notify, subject: str, body: str, context: dict[str, Any] | None = None) -> None:
    """Send now (from a task); no-op without recipients or a notifier, a log line without a mail connection."""
    if not notify.email and not notify.notifier:
        return
    if _mail_connection_missing(notify):
        _not_sent(notify, subject)
        return
    notifier = build_notifier(notify, subject, body)
    notifier.notify(context or {})


async def deadline_missed(context: dict[str, Any] | None = None, **kwargs: Any) -> None:
    """``AsyncCallback`` of a table DAG's ``DeadlineAlert``: runs in the triggerer."""
    from delta_mirror.table_config import load_config

    table = str(kwargs["table"])
    cfg = load_config().table(table)
    context = context or {}
    dag_run = context.get("dag_run")
    run_id = dag_run.get("dag_run_id") if isinstance(dag_run, dict) else getattr(dag_run, "dag_run_id", None)
    deadline = kwargs.get("deadline", "")
    subject = f"[delta-mirror] {table}: deadline missed ({cfg.dag_id})"
    body = (
        f"The DAG run {run_id} of {cfg.dag_id} did not finish within {deadline}.\n"
        f"Readers of '{table}' may see stale data until it catches up.\n"
        f"What to do: open the run in Airflow, check the failed or slow task; `delta-mirror status {table}` "
        f"shows the lag."
    )
    if not cfg.notify.email and not cfg.notify.notifier:
        return
    if await _amail_connection_missing(cfg.notify):
        _not_sent(cfg.notify, subject)
        return
    notifier = build_notifier(cfg.notify, subject, body)
    await notifier.async_notify(context)


def task_failure_callback(notify: Notify, table: str) -> Any:
    """``on_failure_callback`` for a table's tasks: names the table, task and error."""

    def callback(context: dict[str, Any]) -> None:
        ti = context.get("ti") or context.get("task_instance")
        task_id = getattr(ti, "task_id", "?")
        dag_id = getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", "?")
        run_id = getattr(ti, "run_id", None) or context.get("run_id")
        error = context.get("exception")
        # The shared DAGs (reconcile, monitor, ...) get the defaults, whose name is "*": name the DAG.
        what = table if table != "*" else dag_id
        subject = f"[delta-mirror] {what}: task {task_id} failed"
        body = (
            f"Table: {table if table != '*' else '(all configured tables)'}\n"
            f"DAG: {dag_id}  Run: {run_id}  Task: {task_id}  Try: {getattr(ti, 'try_number', '?')}\n"
            f"Error: {error}\n\n"
            "What to do: the task log has the details. [TRANSIENT] errors were retried and the next run "
            "or the reconcile DAG picks the versions up again; [CONFLICT] and [DATA] halt the table until "
            "the cause is fixed and `delta-mirror resume <table>` is run, except 'store behind published "
            "log' (a failover or a restore: `delta-mirror recover <table>` adopts the published versions); "
            "[PERMANENT] needs a configuration fix (connection, bucket, location). `delta-mirror status` "
            "shows each table's state.\n"
        )
        send(notify, subject, body, context)

    return callback
