"""Users and vhost permissions managed at runtime (the admin API), replicated like everything else.

Users from the configuration file stay as they are; a user created through the log with the same
name takes precedence on every node.  The state machine holds only what the front ends need to
check a login and the permissions: a salted password hash made *before* the command is proposed
(apply never draws random salt), tags, the loopback-only flag and RabbitMQ-style permissions
(configure, write and read regular expressions per vhost).

Command layouts (``[op, conn, token, channel, *args]``):

  USER_PUT(name, password_hash, tags, loopback_only)   creates or replaces; keeps permissions
  USER_DELETE(name)                                    404 if unknown
  PERMISSION_SET(name, vhost, configure, write, read)  404 for an unknown user or vhost
  PERMISSION_CLEAR(name, vhost)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .commands import Op, PermissionClear, PermissionSet, UserDelete, UserPut

if TYPE_CHECKING:
    from .machine import StateMachine


@dataclass(slots=True)
class UserRecord:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    loopback_only: bool = False
    permissions: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # vhost -> (c, w, r)


class UserCommands:
    """Users and permissions, managed through the admin API."""

    def __init__(self, machine: StateMachine) -> None:
        self.m = machine

    def user_handlers(self) -> dict:
        return {
            Op.USER_PUT: self.user_put,
            Op.USER_DELETE: self.user_delete,
            Op.PERMISSION_SET: self.permission_set,
            Op.PERMISSION_CLEAR: self.permission_clear,
        }

    def user_put(self, cmd: UserPut) -> None:
        m = self.m
        name, password_hash, tags, loopback_only = cmd.name, cmd.password_hash, list(cmd.tags), bool(cmd.loopback_only)
        old = m.users.get(name)
        user = UserRecord(name, password_hash, tags, loopback_only, dict(old.permissions) if old else {})
        m.users[name] = user
        self.store_user(user)

    def user_delete(self, cmd: UserDelete) -> None:
        m = self.m
        name = cmd.name
        if m.users.pop(name, None) is None:
            raise m.error(404, f"NOT_FOUND - no user '{name}'")
        if m._persist is not None:
            m._persist.delete_user(name)

    def permission_set(self, cmd: PermissionSet) -> None:
        m = self.m
        name, vhost, configure, write, read = cmd.user, cmd.vhost, cmd.configure, cmd.write, cmd.read
        user = self.user(name)
        if vhost not in m.vhosts:
            raise m.error(404, f"NOT_FOUND - no vhost '{vhost}'")
        user.permissions[vhost] = (configure, write, read)
        self.store_user(user)

    def permission_clear(self, cmd: PermissionClear) -> None:
        user = self.user(cmd.user)
        if user.permissions.pop(cmd.vhost, None) is not None:
            self.store_user(user)

    def user(self, name: str) -> UserRecord:
        m = self.m
        user = m.users.get(name)
        if user is None:
            raise m.error(404, f"NOT_FOUND - no user '{name}'")
        return user

    def store_user(self, user: UserRecord) -> None:
        m = self.m
        if m._persist is not None:
            m._persist.put_user(user.name, [user.password_hash, user.tags, user.loopback_only,
                                         {vh: list(p) for vh, p in user.permissions.items()}])
