"""Users and vhost permissions managed at runtime (the admin API), replicated like everything else.

Users from the configuration file keep their password and tags from the file; a user created through
the log with the same name takes precedence on every node.  Their *permissions* can be changed
through the log too (RabbitMQ has no such distinction: ``PUT /api/permissions/v/guest`` and a vhost's
creator rule work for every user): PERMISSION_SET/CLEAR for a name that is not a managed user go to
``permission_overlay`` (name -> vhost -> patterns, or None for a permission of the file cleared), which
node/auth.py applies on top of the file's permissions.  The machine cannot know the file's users
(configuration is not replicated state): the admin API checks that the name is one.  The state machine holds only what the front ends need to
check a login and the permissions: a salted password hash made *before* the command is proposed
(apply never draws random salt), tags, the loopback-only flag and RabbitMQ-style permissions
(configure, write and read regular expressions per vhost).

Command layouts (``[op, conn, token, channel, *args]``):

  USER_PUT(name, password_hash, tags, loopback_only)   creates or replaces; keeps permissions
  USER_DELETE(name)                                    404 if unknown
  PERMISSION_SET(name, vhost, configure, write, read)  404 for an unknown vhost; a name that is
                                                       not a managed user: the overlay
  PERMISSION_CLEAR(name, vhost)                        (the overlay: a tombstone hiding the file's)

A deleted vhost (VHOST_DELETE, store/core/topology.py) takes every permission on it along, overlay
entries included (``forget_vhost``).
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


def overlaid(permissions: dict[str, tuple[str, str, str]],
             overlay: dict[str, tuple[str, str, str] | None] | None) -> dict[str, tuple[str, str, str]]:
    """A configuration-file user's permissions with the admin API's changes applied on top."""
    if not overlay:
        return dict(permissions)
    result = dict(permissions)
    for vhost, patterns in overlay.items():
        if patterns is None:
            result.pop(vhost, None)
        else:
            configure, write, read = patterns  # a list when it came through msgpack
            result[vhost] = (configure, write, read)
    return result


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
        if m.permission_overlay.pop(name, None) is not None and m._persist is not None:
            m._persist.delete_overlay(name)  # a user's permissions go with it (RabbitMQ)
        m.limit_commands.forget("user", name)  # and its limits (store/core/limits.py)

    def permission_set(self, cmd: PermissionSet) -> None:
        m = self.m
        name, vhost, configure, write, read = cmd.user, cmd.vhost, cmd.configure, cmd.write, cmd.read
        if vhost not in m.vhosts:
            raise m.error(404, f"NOT_FOUND - no vhost '{vhost}'")
        user = m.users.get(name)
        if user is None:  # a user of the configuration file (the admin API checked the name)
            m.permission_overlay.setdefault(name, {})[vhost] = (configure, write, read)
            self.store_overlay(name)
            return
        user.permissions[vhost] = (configure, write, read)
        self.store_user(user)

    def permission_clear(self, cmd: PermissionClear) -> None:
        m = self.m
        user = m.users.get(cmd.user)
        if user is None:
            # A tombstone: the file's permission on this vhost, if any, stops applying.
            overlay = m.permission_overlay.setdefault(cmd.user, {})
            if overlay.get(cmd.vhost, ()) is not None:
                overlay[cmd.vhost] = None
                self.store_overlay(cmd.user)
            return
        if user.permissions.pop(cmd.vhost, None) is not None:
            self.store_user(user)

    def forget_vhost(self, vhost: str) -> None:
        """A deleted vhost's permissions, every user's, in name order (deterministic anyway)."""
        m = self.m
        for user in m.users.values():
            if user.permissions.pop(vhost, None) is not None:
                self.store_user(user)
        for name in list(m.permission_overlay):
            if vhost in m.permission_overlay[name]:
                del m.permission_overlay[name][vhost]
                self.store_overlay(name)

    def store_overlay(self, name: str) -> None:
        m = self.m
        overlay = m.permission_overlay.get(name)
        if not overlay:
            m.permission_overlay.pop(name, None)
        if m._persist is not None:
            if overlay:
                m._persist.put_overlay(name, {vh: list(p) if p is not None else None for vh, p in overlay.items()})
            else:
                m._persist.delete_overlay(name)

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
