"""`raftmq admin ...`: the gRPC admin API from the command line (tables, or ``--json``)."""

from __future__ import annotations

import json
import sys


def _cell(value) -> str:
    """A table cell: lists comma-separated, a nested record as its values joined by spaces."""
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return " ".join(str(v) for v in value.values())
    return str(value)


def _table(rows: list[dict], columns: list[str]) -> str:
    cells = [{c: _cell(r.get(c, "")) for c in columns} for r in rows]
    widths = {c: max([len(c)] + [len(r[c]) for r in cells]) for c in columns}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in columns)]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in columns) for r in cells]
    return "\n".join(lines)


def run(args) -> int:
    # Imported here: the server's command line must not depend on the admin client's modules.
    import grpc
    from google.protobuf.json_format import MessageToDict

    from .admin import admin_stub

    stub = admin_stub(args.address, args.tls_ca, args.auth_user, args.auth_password)
    try:
        reply, rows, columns = _call(stub, args)
    except grpc.RpcError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    data = MessageToDict(reply, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    elif rows is not None:
        print(_table(data.get(rows, []), columns))
    else:
        for key, value in data.items():
            if isinstance(value, list) and value and isinstance(value[0], dict):
                print(f"{key}:")
                print(_table(value, list(value[0]) if value else []))
            else:
                print(f"{key}: {_cell(value)}")
    return 0


def _call(stub, args):
    from .proto import admin_pb2 as pb

    cmd = args.admin_command
    if cmd == "status":
        return stub.Status(pb.Empty(), timeout=10), None, None
    if cmd == "health":
        return stub.Health(pb.Empty(), timeout=10), None, None
    if cmd == "queues":
        return stub.ListQueues(pb.Empty(), timeout=10), "queues", [
            "vhost", "name", "durable", "messages_ready", "messages_unacked", "consumers"]
    if cmd == "exchanges":
        return stub.ListExchanges(pb.Empty(), timeout=10), "exchanges", ["vhost", "name", "type", "durable",
                                                                           "bindings"]
    if cmd == "connections":
        return stub.ListConnections(pb.Empty(), timeout=10), "connections", ["id", "peer", "protocol", "user",
                                                                              "vhost"]
    if cmd == "consumers":
        return stub.ListConsumers(pb.Empty(), timeout=10), "consumers", [
            "vhost", "queue", "tag", "connection", "channel", "prefetch", "unacked", "ack_required"]
    if cmd == "declare-exchange":
        arguments = dict(a.split("=", 1) for a in args.arg or [])
        return stub.DeclareExchange(pb.DeclareExchangeRequest(
            vhost=args.vhost, name=args.name, type=args.type, durable=args.durable, auto_delete=args.auto_delete,
            internal=args.internal, arguments=arguments), timeout=10), None, None
    if cmd == "delete-exchange":
        return stub.DeleteExchange(pb.ExchangeRef(vhost=args.vhost, name=args.name, if_unused=args.if_unused),
                                   timeout=10), None, None
    if cmd == "declare-queue":
        arguments = dict(a.split("=", 1) for a in args.arg or [])
        return stub.DeclareQueue(pb.DeclareQueueRequest(vhost=args.vhost, name=args.name, durable=args.durable,
                                                        arguments=arguments), timeout=10), None, None
    if cmd == "delete-queue":
        return stub.DeleteQueue(pb.QueueRef(vhost=args.vhost, name=args.name), timeout=10), None, None
    if cmd == "purge-queue":
        return stub.PurgeQueue(pb.QueueRef(vhost=args.vhost, name=args.name), timeout=10), None, None
    if cmd == "close-connection":
        return stub.CloseConnection(pb.CloseConnectionRequest(id=args.id, reason=args.reason or ""),
                                    timeout=10), None, None
    if cmd in ("add-member", "remove-member"):
        call = stub.AddMember if cmd == "add-member" else stub.RemoveMember
        return call(pb.MemberRequest(raft_address=args.raft_address), timeout=60), None, None
    if cmd == "users":
        return stub.ListUsers(pb.Empty(), timeout=10), "users", ["name", "source", "tags", "loopback_only",
                                                                  "permissions"]
    if cmd == "put-user":
        return stub.PutUser(pb.PutUserRequest(name=args.name, password=args.password, tags=args.tag or [],
                                              loopback_only=args.loopback_only), timeout=10), None, None
    if cmd == "delete-user":
        return stub.DeleteUser(pb.UserRef(name=args.name), timeout=10), None, None
    if cmd == "set-permissions":
        return stub.SetPermissions(pb.PermissionRequest(user=args.user, vhost=args.vhost, configure=args.configure,
                                                        write=args.write, read=args.read), timeout=10), None, None
    if cmd == "clear-permissions":
        return stub.ClearPermissions(pb.PermissionRequest(user=args.user, vhost=args.vhost), timeout=10), None, None
    if cmd in ("set-vhost-limits", "set-user-limits"):
        scope, name = ("vhost", args.vhost) if cmd == "set-vhost-limits" else ("user", args.user)
        return stub.SetLimits(pb.LimitsRequest(scope=scope, name=name, definition=args.definition),
                              timeout=10), None, None
    if cmd in ("clear-vhost-limits", "clear-user-limits"):
        scope, name = ("vhost", args.vhost) if cmd == "clear-vhost-limits" else ("user", args.user)
        return stub.ClearLimits(pb.LimitsRequest(scope=scope, name=name, limit=getattr(args, "limit", "all")),
                                timeout=10), None, None
    if cmd in ("list-vhost-limits", "list-user-limits"):
        scope, name = ("vhost", args.vhost) if cmd == "list-vhost-limits" else ("user", args.user)
        return stub.ListLimits(pb.LimitsRequest(scope=scope, name=name or ""), timeout=10), "limits", [
            "name", "value"]
    if cmd == "compact":
        return stub.CompactLog(pb.Empty(), timeout=90), None, None
    if cmd == "snapshot":
        return stub.SnapshotHistory(pb.SnapshotRequest(path=args.path), timeout=600), None, None
    raise SystemExit(f"unknown admin command {cmd}")


def add_parser(sub) -> None:
    admin = sub.add_parser("admin", help="the node's gRPC admin API (status, queues, connections...)")
    admin.add_argument("--address", default="127.0.0.1:15680", help="host:port of a node's admin port")
    admin.add_argument("--user", dest="auth_user", default="guest",
                       help="log in as this user, who needs the administrator tag (default guest)")
    admin.add_argument("--password", dest="auth_password", default="guest", help="its password (default guest)")
    admin.add_argument("--json", action="store_true", help="JSON instead of tables")
    admin.add_argument("--tls-ca", help="CA certificate (PEM) to verify a TLS admin port (admin_tls_cert)")
    cmds = admin.add_subparsers(dest="admin_command", required=True)
    for name in ("status", "health", "queues", "exchanges", "connections", "consumers", "users"):
        cmds.add_parser(name)
    put_user = cmds.add_parser("put-user", help="create or replace a user (replicated; the password is hashed)")
    put_user.add_argument("name")
    put_user.add_argument("--password", required=True)
    put_user.add_argument("--tag", action="append", help="a tag such as administrator (repeatable)")
    put_user.add_argument("--loopback-only", action="store_true", help="may only connect from localhost")
    cmds.add_parser("delete-user").add_argument("name")
    set_perms = cmds.add_parser("set-permissions", help="configure/write/read regular expressions for a vhost")
    set_perms.add_argument("user")
    set_perms.add_argument("configure")
    set_perms.add_argument("write")
    set_perms.add_argument("read")
    set_perms.add_argument("--vhost", default="/")
    clear_perms = cmds.add_parser("clear-permissions")
    clear_perms.add_argument("user")
    clear_perms.add_argument("--vhost", default="/")
    _add_limit_parsers(cmds)
    cmds.add_parser("compact", help="snapshot the state and compact this node's Raft journal")
    for name in ("declare-queue", "delete-queue", "purge-queue"):
        p = cmds.add_parser(name)
        p.add_argument("name")
        p.add_argument("--vhost", default="/")
        if name == "declare-queue":
            p.add_argument("--durable", action="store_true")
            p.add_argument("--arg", action="append", help="x-argument as key=value (repeatable)")
    declare_exchange = cmds.add_parser("declare-exchange")
    declare_exchange.add_argument("name")
    declare_exchange.add_argument("--type", default="direct", choices=["direct", "fanout", "topic", "headers"])
    declare_exchange.add_argument("--vhost", default="/")
    declare_exchange.add_argument("--durable", action="store_true")
    declare_exchange.add_argument("--auto-delete", action="store_true")
    declare_exchange.add_argument("--internal", action="store_true")
    declare_exchange.add_argument("--arg", action="append", help="x-argument as key=value (repeatable)")
    delete_exchange = cmds.add_parser("delete-exchange")
    delete_exchange.add_argument("name")
    delete_exchange.add_argument("--vhost", default="/")
    delete_exchange.add_argument("--if-unused", action="store_true")
    close = cmds.add_parser("close-connection")
    close.add_argument("id")
    close.add_argument("--reason")
    for name in ("add-member", "remove-member"):
        member = cmds.add_parser(name, help=f"{name.split('-')[0]} a cluster member (through the leader)")
        member.add_argument("raft_address", help="the member's Raft address host:port")
    snap = cmds.add_parser("snapshot", help="snapshot the node's message history (on the node's disk)")
    snap.add_argument("path", help="an empty or absent directory on the node's machine")
    admin.set_defaults(func=run)


def _add_limit_parsers(cmds) -> None:
    """rabbitmqctl's limit commands, with its argument forms (a JSON object of limits)."""
    example = 'limits as a JSON object, e.g. \'{"max-queues": 100}\' (negative: no limit)'
    p = cmds.add_parser("set-vhost-limits", help="replace a vhost's limits (max-queues, max-connections)")
    p.add_argument("definition", help=example)
    p.add_argument("--vhost", "-p", default="/")
    cmds.add_parser("clear-vhost-limits", help="clear every limit of a vhost").add_argument(
        "--vhost", "-p", default="/")
    cmds.add_parser("list-vhost-limits", help="the vhost's limits; without --vhost every vhost's").add_argument(
        "--vhost", "-p", default="")
    p = cmds.add_parser("set-user-limits", help="set a user's limits (max-connections, max-channels); others stay")
    p.add_argument("user")
    p.add_argument("definition", help=example)
    p = cmds.add_parser("clear-user-limits", help="clear one limit of a user, or all")
    p.add_argument("user")
    p.add_argument("limit", help="max-connections, max-channels or all")
    cmds.add_parser("list-user-limits", help="the user's limits; without --user every user's").add_argument(
        "--user", default="")
