"""Who is told what, through a real SMTP server on 127.0.0.1 (aiosmtpd) behind ``smtp_default``.

- the monitor DAG emails a table's contacts when its lag breaches the table's ``lag_slo``;
- the reconcile DAG re-drives what it can and escalates a halted table and versions that keep
  failing (``attempts >= escalate_after_attempts``);
- the ``DeadlineAlert`` callback sends its email through the async path (the scheduler-driven
  deadline itself is covered by the end-to-end tests);
- a table may use any Airflow notifier class instead of email.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from dm_airflow_kit import MailBox, body_text, make_table, run_dag

from delta_mirror.jobs.publisher import Publisher
from delta_mirror.store import SqlStore
from delta_mirror.table_config import Notify

pytestmark = pytest.mark.usefixtures("airflow_db")


def subject_is(text: str) -> Any:
    return lambda m: str(m["subject"]).startswith(text)


def _tables(store: SqlStore, root: Path, names: tuple[str, ...], *, versions: int) -> None:
    """Tables ``names``, each in its own folder under ``root`` with ``versions`` versions, none published."""
    for name in names:
        (root / name).mkdir()
        make_table(store, name, (root / name).as_uri(), versions=versions)


def test_the_monitor_emails_a_lag_slo_breach_to_the_tables_contacts(
    dm_config: Callable[..., Path], sqlite_store: str, tmp_path: Path, mailbox: MailBox
) -> None:
    store = SqlStore(sqlite_store)
    _tables(store, tmp_path, ("late", "relaxed", "caught_up"), versions=3)
    Publisher(store).publish("caught_up")
    dm_config(
        {
            "late": {"lag_slo": "1s", "notify": {"email": ["late-owner@dm-tests.example"]}},
            "relaxed": {"lag_slo": "1h"},
            "caught_up": {"lag_slo": "1s"},
        },
        notify={"email": ["oncall@dm-tests.example"], "from_email": "mirror@dm-tests.example"},
    )
    time.sleep(1.2)  # the oldest unpublished commit of 'late' is now older than its 1 s SLO

    run = run_dag("delta_mirror_monitor")

    assert run.states() == {"lag": "success", "check_slo": "success"}
    assert run.xcom("check_slo") == ["late"]
    msg = mailbox.wait_for(subject_is("[delta-mirror] late: lag SLO breached"))
    assert msg is not None, mailbox.subjects()
    assert str(msg["subject"]).endswith("s > 1 s)")
    assert msg["to"] == "late-owner@dm-tests.example" and msg["from"] == "mirror@dm-tests.example"
    body = body_text(msg)
    assert "Table: late" in body and "3 version(s) behind" in body and "SLO: 1 s" in body
    assert "What to do:" in body and "reconcile DAG" in body
    assert mailbox.subjects() == [str(msg["subject"])]  # nothing about 'relaxed' or 'caught_up'


def test_the_reconcile_dag_redrives_and_escalates_halted_and_persistently_failing_tables(
    dm_config: Callable[..., Path], sqlite_store: str, tmp_path: Path, mailbox: MailBox
) -> None:
    store = SqlStore(sqlite_store)
    _tables(store, tmp_path, ("healthy", "halted", "failing"), versions=2)
    # halted: a foreign commit file at version 1 (a conflict halts the table)
    (tmp_path / "halted" / "_delta_log").mkdir()
    (tmp_path / "halted" / "_delta_log" / "00000000000000000001.json").write_text('{"commitInfo":{}}\n')
    # failing: its log folder cannot be created (a file is in the way), every attempt fails
    (tmp_path / "failing" / "_delta_log").write_text("not a folder")
    for name in ("halted", "failing"):
        with pytest.raises(Exception):  # noqa: B017 - the first attempt, outside Airflow
            Publisher(store).publish(name)
    dm_config(
        {"healthy": {}, "halted": {}, "failing": {"notify": {"email": ["failing-owner@dm-tests.example"]}}},
        notify={"email": ["oncall@dm-tests.example"]},
        reconcile={"escalate_after_attempts": 2},
    )

    run = run_dag("delta_mirror_reconcile")

    assert run.states() == {"reconcile": "success", "escalate": "success"}
    report = {t["table"]: t for t in run.xcom("reconcile")["tables"]}
    assert report["healthy"]["action"] == "published" and report["healthy"]["published"] == 2
    assert report["halted"]["action"] == "halted"
    assert report["failing"]["action"] == "failed"
    assert sorted(run.xcom("escalate")) == ["failing", "halted"]
    assert store.last_published_version(store.get_table("healthy").id) == 1

    halted = mailbox.wait_for(subject_is("[delta-mirror] halted: persistent publish failures"))
    assert halted is not None, mailbox.subjects()
    body = body_text(halted)
    assert "State: halted" in body and "a different file already exists" in body
    assert "version 1 (json): 1 attempt(s), [CONFLICT]" in body
    assert "delta-mirror resume halted" in body and "docs/troubleshooting.md" in body

    failing = mailbox.wait_for(subject_is("[delta-mirror] failing: persistent publish failures"))
    assert failing is not None, mailbox.subjects()
    assert failing["to"] == "failing-owner@dm-tests.example"
    body = body_text(failing)
    assert "State: failed" in body and "version 0 (json): 2 attempt(s)" in body
    assert "Not a directory" in body and "What to do:" in body
    assert len(mailbox.messages) == 2  # nothing about 'healthy'


def test_the_reconcile_dag_escalates_a_table_whose_publish_attempts_fail_past_the_grace(
    dm_config: Callable[..., Path], sqlite_store: str, tmp_path: Path, mailbox: MailBox
) -> None:
    """Issue 28: the location cannot even be opened (a folder inside a regular file), so no version's
    put fails and no version row says so: the table's failure row does, and the e-mail says it."""
    store = SqlStore(sqlite_store)
    (tmp_path / "blocker").write_text("a regular file")
    for name in ("unreachable", "patient"):
        (tmp_path / name).mkdir()
        make_table(store, name, (tmp_path / name).as_uri(), versions=1)
        store.update_table(store.get_table(name).id, location=(tmp_path / "blocker" / name).as_uri())
    with pytest.raises(Exception, match="Not a directory"):
        Publisher(store).publish(
            "unreachable"
        )  # the first attempt, outside Airflow; the reconcile's is the 2nd
    dm_config(
        {
            "unreachable": {"notify": {"email": ["owner@dm-tests.example"]}},
            "patient": {"failure_grace_attempts": 5, "failure_grace": "1h"},
        },
        notify={"email": ["oncall@dm-tests.example"]},
    )

    run = run_dag("delta_mirror_reconcile")

    assert run.states() == {"reconcile": "success", "escalate": "success"}
    report = {t["table"]: t for t in run.xcom("reconcile")["tables"]}
    assert report["unreachable"]["table_failure"]["attempts"] == 2
    assert report["unreachable"]["persistent_failures"] == []  # no version row failed
    assert report["patient"]["table_failure"]["attempts"] == 1  # within its own grace: no e-mail
    assert run.xcom("escalate") == ["unreachable"]
    msg = mailbox.wait_for(subject_is("[delta-mirror] unreachable: persistent publish failures"))
    assert msg is not None, mailbox.subjects()
    assert msg["to"] == "owner@dm-tests.example"
    body = body_text(msg)
    assert "Publishing: publishing failed 2 attempt(s) in a row" in body
    assert "[PERMANENT]" in body and "Not a directory" in body and "What to do:" in body
    assert len(mailbox.messages) == 1


def test_a_task_failure_in_a_shared_dag_names_the_dag_and_what_to_do(
    dm_config: Callable[..., Path], sqlite_store: str, mailbox: MailBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    from delta_mirror.errors import PermanentError

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise PermanentError("the store schema is too new", hint="upgrade delta-mirror")

    monkeypatch.setattr("delta_mirror.jobs.reconcile.reconcile", broken)
    dm_config({}, notify={"email": ["oncall@dm-tests.example"]}, retries=1)

    run = run_dag("delta_mirror_reconcile")

    assert (run.tasks["reconcile"].state, run.tasks["reconcile"].try_number) == ("failed", 1)
    msg = mailbox.wait_for(subject_is("[delta-mirror] delta_mirror_reconcile: task reconcile failed"))
    assert msg is not None, mailbox.subjects()
    body = body_text(msg)
    assert "[PERMANENT] the store schema is too new" in body and "What to do:" in body


def test_the_deadline_callback_emails_the_table_contacts(
    dm_config: Callable[..., Path], mailbox: MailBox, tmp_path: Path
) -> None:
    from delta_mirror.airflow.notifications import deadline_missed

    dm_config({"t1": {"notify": {"email": ["t1-owner@dm-tests.example"]}}})
    asyncio.run(
        deadline_missed(context={"dag_run": {"dag_run_id": "scheduled__x"}}, table="t1", deadline="0:30:00")
    )

    msg = mailbox.wait_for(subject_is("[delta-mirror] t1: deadline missed (delta_mirror__t1)"))
    assert msg is not None, mailbox.subjects()
    body = body_text(msg)
    assert "The DAG run scheduled__x of delta_mirror__t1 did not finish within 0:30:00" in body
    assert "What to do:" in body and "delta-mirror status t1" in body


class RecordingNotifier:
    """Stands in for e.g. ``SlackNotifier``: built from ``notifier_kwargs`` plus the ``text``."""

    template_fields = ("text", "channel")
    sent: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, text: str = "", channel: str = "") -> None:
        self.text, self.channel = text, channel

    def notify(self, context: dict[str, Any]) -> None:
        RecordingNotifier.sent.append({"text": self.text, "channel": self.channel})


def test_a_table_may_name_any_notifier_class_instead_of_email(mailbox: MailBox) -> None:
    from delta_mirror.airflow.notifications import send

    RecordingNotifier.sent.clear()
    notify = Notify(notifier=f"{__name__}.RecordingNotifier", notifier_kwargs={"channel": "#data"})
    send(notify, "[delta-mirror] t1: lag SLO breached", "Lag: 99 s")
    assert RecordingNotifier.sent == [
        {"text": "[delta-mirror] t1: lag SLO breached\nLag: 99 s", "channel": "#data"}
    ]
    send(Notify(email=()), "nobody", "to tell")  # no recipients: nothing is sent
    assert mailbox.messages == []


def test_without_a_mail_connection_an_alert_is_one_log_line_not_a_traceback(
    airflow_env: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """The local ``make airflow`` has no SMTP connection: each alert says what would have gone where."""
    from delta_mirror.airflow import notifications

    notify = Notify(email=("oncall@dm-tests.example", "data@dm-tests.example"), smtp_conn_id="smtp_nowhere")
    with caplog.at_level("WARNING", logger=notifications.__name__):
        notifications.send(notify, "[delta-mirror] t1: task publish failed", "Error: boom")
        assert asyncio.run(notifications._amail_connection_missing(notify)) is True
    lines = [r.getMessage() for r in caplog.records if r.name == notifications.__name__]
    assert lines == [
        "no mail connection 'smtp_nowhere': the alert \"[delta-mirror] t1: task publish failed\" to "
        "oncall@dm-tests.example, data@dm-tests.example was not sent (set AIRFLOW_CONN_SMTP_NOWHERE to an "
        "SMTP URL, docs/airflow.md: Alerts)"
    ]
    assert "Traceback" not in caplog.text


def test_with_the_mail_connection_the_alert_is_sent(mailbox: MailBox) -> None:
    from delta_mirror.airflow import notifications

    notify = Notify(email=("oncall@dm-tests.example",))
    assert asyncio.run(notifications._amail_connection_missing(notify)) is False
    notifications.send(notify, "[delta-mirror] t1: lag SLO breached", "Lag: 99 s")
    assert mailbox.wait_for(subject_is("[delta-mirror] t1: lag SLO breached")) is not None
