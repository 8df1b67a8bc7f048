"""A real SMTP server on 127.0.0.1 for alert tests (aiosmtpd in a thread), shared by test packages."""

from __future__ import annotations

import email
import email.policy
import json
import threading
import time
from collections.abc import Callable
from email.message import EmailMessage
from typing import Any

from support.services import free_port


class MailBox:
    """aiosmtpd handler: keeps every message; ``wait_for`` blocks until one matches."""

    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self._cond = threading.Condition()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        raw = envelope.original_content or envelope.content
        if isinstance(raw, str):
            raw = raw.encode()
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        assert isinstance(msg, EmailMessage)
        with self._cond:
            self.messages.append(msg)
            self._cond.notify_all()
        return "250 Message accepted for delivery"

    def clear(self) -> None:
        with self._cond:
            self.messages.clear()

    def subjects(self) -> list[str]:
        with self._cond:
            return [str(m["subject"]) for m in self.messages]

    def wait_for(self, match: Callable[[EmailMessage], bool], timeout: float = 10.0) -> EmailMessage | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for m in self.messages:
                    if match(m):
                        return m
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)


def body_text(msg: EmailMessage) -> str:
    """The message body as text (HTML entities unescaped)."""
    import html

    part = msg.get_body(preferencelist=("html", "plain"))
    assert part is not None
    return html.unescape(part.get_content())


class SmtpServer:
    """A real SMTP server on 127.0.0.1 (aiosmtpd in a thread), no TLS, no authentication."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.mailbox = MailBox()
        self.port = free_port()
        self._controller = Controller(self.mailbox, hostname="127.0.0.1", port=self.port)
        self._controller.start()

    def connection_json(self, from_email: str = "airflow@dm-tests.example") -> str:
        """``AIRFLOW_CONN_SMTP_DEFAULT``: the SMTP provider's extras turn TLS and SSL off."""
        return json.dumps(
            {
                "conn_type": "smtp",
                "host": "127.0.0.1",
                "port": self.port,
                "extra": {
                    "disable_tls": True,
                    "disable_ssl": True,
                    "from_email": from_email,
                    "timeout": 10,
                    "retry_limit": 1,
                },
            }
        )

    def stop(self) -> None:
        self._controller.stop()
