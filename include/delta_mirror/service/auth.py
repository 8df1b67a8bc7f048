"""The commit service's token check: ``Authorization: Bearer <token>``, compared in constant time.

The token is never logged, echoed in an answer or kept anywhere but here.
"""

from __future__ import annotations

import hmac

from delta_mirror.service.errors import UnauthorizedError

#: The environment variable holding the service's token (``delta-mirror serve`` and its workers).
TOKEN_ENV = "DELTA_MIRROR_COMMIT_TOKEN"


class TokenCheck:
    """Checks the ``Authorization`` header against the service's token; ``None`` turns it off."""

    __slots__ = ("_token",)

    def __init__(self, token: str | None) -> None:
        self._token = token.encode("utf-8") if token else None

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def check(self, header: str) -> None:
        """Raise ``UnauthorizedError`` unless ``header`` is ``Bearer <the token>`` (any case of
        ``Bearer``)."""
        if self._token is None:
            return
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8"), self._token):
            raise UnauthorizedError(
                "missing or wrong token",
                hint=f"send Authorization: Bearer <the service's {TOKEN_ENV}>",
            )

    def accepts(self, header: str) -> bool:
        try:
            self.check(header)
        except UnauthorizedError:
            return False
        return True


__all__ = ["TOKEN_ENV", "TokenCheck"]
