"""Issue 36, who: a refused declare, a refused consume, a failed login and an admin permission
change appear in a real node's history with the user and address (read back with the history
reader, store/disk/history.py); per-message events name the connection whose principal the
``connections`` table holds.  The scenario is tests/support/audit_who.py (pika and the HTTP API).

With queue groups (issue 34, ``RAFTMQ_RAFT_GROUPS=3``) the events are read from every group's
history of the snapshot, merged by time (``_events``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raftmq.store.disk import history as EV
from tests.support import audit_who
from tests.support.groups import GROUPS


@pytest.fixture(scope="module")
def who(tmp_path_factory, broker_kind):
    if broker_kind != "raftmq":
        pytest.skip("raftmq's audit history")
    return audit_who.run(tmp_path_factory.mktemp("who"))


def _events(who) -> list[list]:
    """Every event of the node's snapshot: with queue groups (issue 34) the metadata group's (the
    connections' notes, the metadata) and each queue group's (its queues' messages), from
    ``<snapshot>/groups/g<N>``, merged by time (then group, then each group's own sequence): a
    connection's events span the groups."""
    histories = [Path(who.snapshot)] + [Path(who.snapshot) / "groups" / f"g{g}" for g in range(1, GROUPS)]
    merged = [(e[1], group, e[0], e) for group, history in enumerate(histories) for e in EV.read_events(str(history))]
    return [e for *_key, e in sorted(merged, key=lambda item: item[:3])]


def _kind(events: list[list], name: str) -> list[list]:
    return [e for e in events if EV.KIND_NAMES[e[2]] == name]


def test_refused_declare_and_consume_name_the_user_address_operation_and_permission(who):
    """Two access_refused events (0-9-1 403): queue, operation and the permission lacking, with
    alice's principal (user, protocol, the client's address and connection name) and connection."""
    refused = [e for e in _kind(_events(who), "access_refused") if e[3] == "/" and e[12][1] != "http"]
    assert [(e[4], e[9]) for e in refused] == [("payroll-copy", "queue_declare needs configure"),
                                               ("payroll", "consume needs read")]
    for e in refused:
        assert e[12] == [audit_who.ALICE, "AMQP 0-9-1", who.alice_address, audit_who.CONNECTION_NAME]
        assert e[11] and e[3] == "/"


def test_a_refused_vhost_names_the_user_and_vhost(who):
    """connection.open of a vhost alice has no permissions in (530): access_refused in that vhost."""
    (refused,) = [e for e in _kind(_events(who), "access_refused") if e[3] == audit_who.OTHER_VHOST]
    assert refused[9] == "connection_open needs access" and refused[12][:2] == [audit_who.ALICE, "AMQP 0-9-1"]
    assert refused[12][2].startswith("127.0.0.1:")


def test_a_refused_http_declare_names_the_operator_and_http(who):
    """PUT /api/queues by a management user without configure there: access_refused over http."""
    (refused,) = [e for e in _kind(_events(who), "access_refused") if e[12][1] == "http"]
    assert refused[12][:3] == [audit_who.CAROL, "http", "127.0.0.1"]
    assert (refused[3], refused[4], refused[9]) == ("/", "payroll-archive", "queue_declare needs configure")
    assert refused[11] is None  # no client connection: the operator's principal is in the record


def test_a_failed_login_names_the_user_tried_mechanism_and_address(who):
    """login_refused: the user name tried, PLAIN (pika's mechanism), the client's host."""
    (login,) = [e for e in _kind(_events(who), "login_refused") if e[12][1] != "management"]
    user, _protocol, address, _name = login[12]
    assert user == who.intruder_user and address == "127.0.0.1"
    assert login[9].startswith("PLAIN: ")


def test_a_failed_management_login_is_noted_too(who):
    """A wrong password on the HTTP API (401): login_refused, protocol management, the address."""
    (login,) = [e for e in _kind(_events(who), "login_refused") if e[12][1] == "management"]
    assert login[12][0] == audit_who.CAROL and login[12][2] == "127.0.0.1" and login[9].startswith("PLAIN: ")


def test_an_admin_permission_change_names_the_operator_api_address_and_change(who):
    """admin_change from PUT /api/permissions: guest over http from 127.0.0.1, what was set."""
    changes = _kind(_events(who), "admin_change")
    (change,) = [e for e in changes if "set_permissions" in e[9]]
    assert change[12][:3] == ["guest", "http", "127.0.0.1"]
    assert change[3] == "/" and "user='alice'" in change[9] and "write='^alice-'" in change[9]


def test_an_admin_change_through_the_cli_names_grpc(who):
    """admin_change from ``raftmq admin set-user-limits`` (gRPC admin): guest over grpc, the peer."""
    (change,) = [e for e in _kind(_events(who), "admin_change") if "set_limits" in e[9]]
    user, protocol, address, _name = change[12]
    assert (user, protocol) == ("guest", "grpc") and "127.0.0.1" in address
    assert change[9] == "set_limits user='alice' max-channels=7"


def test_per_message_events_join_the_connection_principal(who):
    """published, delivered (basic.get) and acked name alice's connection; the connections table
    holds her principal once, with open and close times; connection_opened/closed bracket them."""
    events = _events(who)
    conns = {c[0]: c for c in EV.read_table(who.snapshot, "connections")}
    alices = [c for c in conns.values() if c[1] == audit_who.ALICE]
    assert len(alices) == 1
    conn, user, vhost, protocol, address, name, opened, closed = alices[0]
    assert (vhost, protocol, address, name) == ("/", "AMQP 0-9-1", who.alice_address, audit_who.CONNECTION_NAME)
    assert opened <= closed
    mine = [e for e in events if e[11] == conn]
    kinds = [EV.KIND_NAMES[e[2]] for e in mine]
    assert kinds[0] == "connection_opened" and kinds[-1] == "connection_closed"
    for kind in ("published", "delivered", "acked"):
        assert kind in kinds, kind
    assert all(e[4] in ("alice-inbox", "payroll-copy", "payroll", "") for e in mine)


def test_amqp010_and_amqp10_connections_are_noted_with_their_protocol(tmp_path, broker_kind):
    """The 0-10 front end (raftmq's client) and the 1.0 front end (python-qpid-proton) note their
    connections too: connection_opened and connection_closed with user, protocol and address, and a
    1.0 connection's container id as its name (AMQP 1.0 2.7.1 open container-id)."""
    if broker_kind != "raftmq":
        pytest.skip("raftmq's audit history")
    import asyncio

    proton_utils = pytest.importorskip("proton.utils")
    from proton.reactor import Container

    from raftmq.client.amqp010 import Connection
    from raftmq.ops.local.node import RaftmqNode

    with RaftmqNode(tmp_path / "n", env={"RAFTMQ_AUDIT_RETENTION": "metadata"}) as node:
        async def amqp010() -> None:
            conn = await Connection.connect([f"127.0.0.1:{node.port}"])
            await conn.close()

        asyncio.run(asyncio.wait_for(amqp010(), 30))
        conn = proton_utils.BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=10,
                                               container=Container(container_id="audit-who-container"))
        conn.close()
        node.wait_history()
    events = list(EV.read_events(str(node.data_dir / "events")))
    for protocol in ("AMQP 0-10", "AMQP 1.0"):
        mine = [e for e in events if e[12] is not None and e[12][1] == protocol]
        assert [EV.KIND_NAMES[e[2]] for e in mine] == ["connection_opened", "connection_closed"], protocol
        assert mine[0][12][0] == "guest" and mine[0][12][2].startswith("127.0.0.1:") and mine[0][11] == mine[1][11]
    (amqp10,) = [e for e in events if e[2] == EV.CONNECTION_OPENED and e[12][1] == "AMQP 1.0"]
    assert amqp10[12][3] == "audit-who-container"


def test_a_login_flood_is_bounded_in_the_history_and_counted(tmp_path, broker_kind):
    """60 wrong passwords on the HTTP API from one address within about a second: at most 5
    login_refused notes a second reach the log (node/audit.py), the rest arrive as counts in
    "N more like this suppressed" notes -- every attempt is accounted for, none floods the log."""
    if broker_kind != "raftmq":
        pytest.skip("raftmq's audit history")
    import re
    import time

    from tests.integration.helpers import http_node
    from tests.support.http_api import call, path

    attempts = 60
    node = http_node(tmp_path)
    node.extra_env["RAFTMQ_AUDIT_RETENTION"] = "metadata"
    with node:
        started = time.monotonic()
        for i in range(attempts):
            assert call(node.http, "GET", path("overview"), auth=("guest", f"wrong-{i}"))[0] == 401
        elapsed = time.monotonic() - started
        time.sleep(1.5)  # the window ends; the tick loop proposes the held-back count
        status = node.wait_history()
    refused = [e for e in EV.read_events(str(node.data_dir / "events")) if e[2] == EV.LOGIN_REFUSED]
    counted = [int(m.group(1)) for e in refused if (m := re.match(r"(\d+) more like this suppressed", e[9]))]
    single = len(refused) - len(counted)
    assert single + sum(counted) == attempts
    assert counted and single <= 5 * (int(elapsed) + 2)  # 5 per one-second window
    assert status["audit_notes_suppressed"] == sum(counted)
