"""Authentication (SASL PLAIN and AMQPLAIN) and RabbitMQ-style vhost permissions."""

from __future__ import annotations

import hmac
import ipaddress
import re
from dataclasses import dataclass

from raftmq.ops.config import UserConfig

MECHANISMS = ("PLAIN", "AMQPLAIN")


class AuthError(Exception):
    pass


def parse_plain(response: bytes) -> tuple[str, str]:
    """RFC 4616: [authzid] NUL authcid NUL passwd."""
    parts = response.split(b"\x00")
    if len(parts) != 3:
        raise AuthError("malformed PLAIN response")
    return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")


def parse_amqplain(response: bytes) -> tuple[str, str]:
    """AMQPLAIN: a field table without its length prefix holding LOGIN and PASSWORD."""
    from raftmq.protocol.amqp091.errors import AMQPError
    from raftmq.protocol.amqp091.fieldtable import decode_table

    try:
        table, _ = decode_table(len(response).to_bytes(4, "big") + response, 0)
    except AMQPError as exc:
        raise AuthError("malformed AMQPLAIN response") from exc
    login, password = table.get("LOGIN"), table.get("PASSWORD")
    if isinstance(login, bytes):
        login = login.decode("utf-8", "replace")
    if isinstance(password, bytes):
        password = password.decode("utf-8", "replace")
    if not isinstance(login, str) or not isinstance(password, str):
        raise AuthError("AMQPLAIN response lacks LOGIN/PASSWORD")
    return login, password


def is_loopback(peer_host: str | None) -> bool:
    if not peer_host:
        return False
    try:
        return ipaddress.ip_address(peer_host.split("%")[0]).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Principal:
    name: str
    permissions: dict[str, tuple[re.Pattern, re.Pattern, re.Pattern]]

    def may_access_vhost(self, vhost: str) -> bool:
        return vhost in self.permissions

    def _check(self, vhost: str, kind: int, resource: str) -> bool:
        perms = self.permissions.get(vhost)
        return perms is not None and perms[kind].fullmatch(resource) is not None

    def may_configure(self, vhost: str, resource: str) -> bool:
        return self._check(vhost, 0, resource)

    def may_write(self, vhost: str, resource: str) -> bool:
        return self._check(vhost, 1, resource)

    def may_read(self, vhost: str, resource: str) -> bool:
        return self._check(vhost, 2, resource)


class Authenticator:
    def __init__(self, users: dict[str, UserConfig]) -> None:
        self._users = users
        self._principals = {
            name: Principal(name, {vh: tuple(re.compile(p) for p in perms)
                                   for vh, perms in user.permissions.items()})
            for name, user in users.items()
        }

    def authenticate(self, mechanism: str, response: bytes, peer_host: str | None) -> Principal:
        if mechanism == "PLAIN":
            username, password = parse_plain(response)
        elif mechanism == "AMQPLAIN":
            username, password = parse_amqplain(response)
        else:
            raise AuthError(f"unsupported authentication mechanism '{mechanism}'")
        user = self._users.get(username)
        if user is None or not hmac.compare_digest(user.password.encode(), password.encode()):
            raise AuthError(f"Login was refused using authentication mechanism {mechanism}.")
        if user.loopback_only and not is_loopback(peer_host):
            raise AuthError(f"user '{username}' can only connect via localhost")
        return self._principals[username]
