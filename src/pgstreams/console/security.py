"""The console's safety: loopback unless credentials are set, authentication (a token or basic auth),
and CSRF protection of the actions that change data."""

from __future__ import annotations

import base64
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import ConfigurationError
from ..names import is_loopback
from .defaults import PASSWORD_ENV, TOKEN_ENV, USER_ENV

#: The cookie a token given once as ``?token=`` is kept in.
TOKEN_COOKIE = "pgstreams_console_token"


@dataclass(frozen=True)
class Credentials:
    """What a request must present: a ``token`` (``Authorization: Bearer``, or ``?token=`` once, then a
    cookie) or basic-auth ``user`` and ``password``; none of them: no authentication (loopback only)."""

    token: str | None = None
    user: str | None = None
    password: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Credentials:
        """From ``PGSTREAMS_CONSOLE_TOKEN``, ``PGSTREAMS_CONSOLE_USER`` and ``PGSTREAMS_CONSOLE_PASSWORD``;
        a user without a password (or the reverse) is refused."""
        env = os.environ if env is None else env
        token = env.get(TOKEN_ENV) or None
        user = env.get(USER_ENV) or None
        password = env.get(PASSWORD_ENV) or None
        if (user is None) != (password is None):
            raise ConfigurationError(f"set both {USER_ENV} and {PASSWORD_ENV} for basic authentication, "
                                     "or neither")
        return cls(token, user, password)

    @property
    def required(self) -> bool:
        """Whether requests must authenticate."""
        return self.token is not None or self.user is not None

    def accepts(self, authorization: str | None, cookie_token: str | None) -> bool:
        """Whether a request with this ``Authorization`` header and token cookie may pass."""
        if not self.required:
            return True
        if self.token is not None:
            for given in (cookie_token, _bearer(authorization)):
                if given is not None and hmac.compare_digest(given.encode(), self.token.encode()):
                    return True
        if self.user is not None and self.password is not None and authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() == "basic":
                try:
                    user, _, password = base64.b64decode(value.strip()).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    return False
                return hmac.compare_digest(user.encode(), self.user.encode()) and hmac.compare_digest(
                    password.encode(), self.password.encode())
        return False


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def check_binding(host: str, credentials: Credentials) -> None:
    """Refuse to listen on ``host`` when it is not loopback and no credentials are set."""
    if not is_loopback(host) and not credentials.required:
        raise ConfigurationError(
            f"the console would listen on {host}, which is not a loopback address, without "
            f"authentication: set {TOKEN_ENV}, or {USER_ENV} and {PASSWORD_ENV}, in the environment")
