"""AMQP 1.0 in a 3-node cluster: a sender on a follower, a receiver on the other follower, and the
leader killed after every message was accepted.

2.6.12: an unsettled transfer's outcome is sent once the publish is applied, which in a cluster means
committed by a majority; so every accepted message must survive the loss of the leader.
"""

from __future__ import annotations

import time

import pika
import pytest
from proton import Delivery, Message
from proton.utils import BlockingConnection

from raftmq.ops.local.cluster import Cluster

pytestmark = pytest.mark.cluster

N = 200


def test_accepted_messages_survive_a_leader_kill(tmp_path) -> None:
    with Cluster(3, tmp_path) as cluster:
        leader = cluster.leader()
        first, second = cluster.followers()
        admin = pika.BlockingConnection(pika.ConnectionParameters(port=first.port))
        admin.channel().queue_declare("a10-durable", durable=True)
        admin.close()
        sender_conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{first.port}", timeout=20)
        sender = sender_conn.create_sender("/queues/a10-durable")
        for i in range(N):
            delivery = sender.send(Message(body=f"{i}", durable=True))
            assert delivery.remote_state == Delivery.ACCEPTED
        sender_conn.close()
        leader.kill9()
        cluster.leader(timeout=20, exclude=leader)
        receiver_conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{second.port}", timeout=20)
        receiver = receiver_conn.create_receiver("/queues/a10-durable", credit=50)
        got = []
        for _ in range(N):
            got.append(int(receiver.receive(timeout=20).body))
            receiver.accept()
        receiver_conn.close()
        assert got == list(range(N))


def test_failover_list_and_redirect_to_leader(tmp_path) -> None:
    """open's failover-server-list names every member; with amqp10_redirect_to_leader a follower answers
    open with amqp:connection:redirect (2.8.16) whose info is the leader's address, the leader opens."""
    from raftmq.protocol.amqp10 import performatives as p
    from tests.integration.test_amqp10_raw import Raw

    with Cluster(3, tmp_path, extra_config="amqp10_redirect_to_leader = true") as cluster:
        leader = cluster.leader()
        follower = cluster.followers()[0]
        raw = Raw(follower.port)
        try:
            raw.login()
            servers = raw.open.properties["failover-server-list"]
            assert sorted(s["port"] for s in servers) == sorted(n.port for n in cluster.nodes)
            close = raw.performative()
            assert isinstance(close, p.Close) and close.error.condition == "amqp:connection:redirect"
            assert (close.error.info["network-host"], close.error.info["port"]) == ("127.0.0.1", leader.port)
        finally:
            raw.close()
        raw = Raw(leader.port)
        try:
            raw.login()
            raw.send(p_encode_begin())
            assert isinstance(raw.performative(), p.Begin)  # open, not redirected
        finally:
            raw.close()


def test_redirect_followed_by_a_client(tmp_path) -> None:
    """2.8.16 amqp:connection:redirect, followed: a client that connects to a follower is sent to the
    leader (network-host, port of the close's info), follows, and works there -- 20 unsettled sends
    accepted, received back.  After the leader is killed -9 the same client, connecting to a node that
    is now a follower, is sent to the new leader and gets the messages there.

    proton's Python reactor and rhea do not follow redirects (tests/support/amqp10_client.py says where
    we looked), so the client is our own small one."""
    from tests.support.amqp10_client import RedirectingClient

    with Cluster(3, tmp_path, extra_config="amqp10_redirect_to_leader = true") as cluster:
        leader = cluster.leader()
        follower = cluster.followers()[0]
        admin = pika.BlockingConnection(pika.ConnectionParameters(port=leader.port))
        admin.channel().queue_declare("a10-redirect", durable=True)
        admin.close()
        client = RedirectingClient("127.0.0.1", follower.port, timeout=20).connect()
        try:
            assert client.redirects == [("127.0.0.1", leader.port)] and client.port == leader.port
            servers = client.opened.properties["failover-server-list"]
            assert sorted(s["port"] for s in servers) == sorted(n.port for n in cluster.nodes)
            bodies = [f"m{i}".encode() for i in range(20)]
            outcomes = client.send("/queues/a10-redirect", bodies)
            assert all(o.__class__.__name__ == "Accepted" for o in outcomes), outcomes
            assert client.receive("/queues/a10-redirect", 10) == bodies[:10]
        finally:
            client.close()
        leader.kill9()
        new_leader = cluster.leader(timeout=20, exclude=leader)
        survivor = next(n for n in cluster.nodes if n is not leader and n is not new_leader)
        deadline = time.monotonic() + 20
        while True:  # the survivor redirects once it knows the new leader; until then it may open itself
            again = RedirectingClient("127.0.0.1", survivor.port, timeout=20).connect()
            if again.redirects or time.monotonic() > deadline:
                break
            again.close()
            time.sleep(0.2)
        try:
            assert again.redirects == [("127.0.0.1", new_leader.port)]
            assert again.receive("/queues/a10-redirect", 10) == bodies[10:]
        finally:
            again.close()


def p_encode_begin() -> bytes:
    from raftmq.protocol.amqp10 import performatives as p
    from raftmq.protocol.amqp10.frames import encode_frame

    return encode_frame(p.Begin(next_outgoing_id=0, incoming_window=10, outgoing_window=10))


def test_durable_link_resumes_on_another_node_after_leader_kill(tmp_path) -> None:
    """2.6.13 across failover: a durable receiver on the leader has 6 deliveries, settles 2, and the leader
    is killed -9; re-attached by name on another node, with delivery 3 reported accepted, it gets exactly
    deliveries 4-6 again under their tags, and after it settles them the queue is empty: nothing lost,
    nothing delivered twice."""
    from raftmq.protocol.amqp10 import performatives as p
    from raftmq.protocol.amqp10.frames import encode_frame
    from tests.integration.test_amqp10_raw import Raw, _durable_receiver, _transfers

    with Cluster(3, tmp_path) as cluster:
        leader = cluster.leader()
        admin = pika.BlockingConnection(pika.ConnectionParameters(port=leader.port))
        channel = admin.channel()
        channel.queue_declare("a10-resume", durable=True)
        for i in range(6):
            channel.basic_publish("", "a10-resume", str(i).encode(), pika.BasicProperties(delivery_mode=2))
        admin.close()
        first = Raw(leader.port)
        first.login("resuming-client")
        _durable_receiver(first, "a10-resume")
        first.send(encode_frame(p.Flow(next_incoming_id=0, incoming_window=1000, next_outgoing_id=0,
                                       outgoing_window=1000, handle=0, delivery_count=0, link_credit=6)))
        got = _transfers(first, 6)
        assert [body for _t, _d, body, _r in got] == [str(i).encode() for i in range(6)]
        tags = [tag for tag, _d, _b, _r in got]
        first.send(encode_frame(p.Disposition(role=True, first=got[0][1], last=got[1][1], settled=True,
                                              state=p.Accepted())))
        first.send(encode_frame(p.Flow(next_incoming_id=6, incoming_window=1000, next_outgoing_id=0,
                                       outgoing_window=1000, handle=0, delivery_count=6, link_credit=0,
                                       echo=True)))
        while not isinstance(first.performative(), p.Flow):
            pass
        cluster.wait_applied_equal()  # the settlement is committed before the leader dies
        leader.kill9()
        first.close()
        survivor = cluster.leader(timeout=20, exclude=leader)
        other = next(n for n in cluster.nodes if n is not leader and n is not survivor)
        second = Raw(other.port)
        try:
            second.login("resuming-client")
            attach = _durable_receiver(second, "a10-resume", unsettled={tags[2]: p.Accepted()})
            assert set(attach.unsettled or {}) == {tags[3], tags[4], tags[5]}
            second.send(encode_frame(p.Flow(next_incoming_id=0, incoming_window=1000, next_outgoing_id=0,
                                            outgoing_window=1000, handle=0, delivery_count=0, link_credit=10)))
            again = _transfers(second, 3)
            assert [(tag, body) for tag, _d, body, _r in again] == [(tags[i], str(i).encode()) for i in (3, 4, 5)]
            second.send(encode_frame(p.Disposition(role=True, first=again[0][1], last=again[2][1], settled=True,
                                                   state=p.Accepted())))
            second.send(encode_frame(p.Detach(handle=0, closed=True)))
            assert isinstance(second.performative(), p.Detach)
        finally:
            second.close()
        admin = pika.BlockingConnection(pika.ConnectionParameters(port=survivor.port))
        assert admin.channel().queue_declare("a10-resume", passive=True, durable=True).method.message_count == 0
        admin.close()


class _Lost(Exception):
    """The node this client was connected to went away (or was killed by the test)."""


def test_durable_receiver_mode_second_through_repeated_leader_kills(tmp_path) -> None:
    """Issue 19: a receiver with a durable link in receiver-settle-mode second, connected to the leader,
    which is killed -9 three times mid-stream; after each kill the client re-attaches the link by name on
    the new leader and reports the deliveries it accepted whose settlement it has not seen (its unsettled
    map).  Every message arrives, none twice, and the queue ends empty."""
    from raftmq.protocol.amqp10 import performatives as p
    from raftmq.protocol.amqp10.frames import encode_frame
    from tests.integration.test_amqp10_raw import Raw, _durable_receiver

    n, kill_at = 60, (15, 30, 45)
    with Cluster(3, tmp_path) as cluster:
        leader = cluster.leader()
        admin = pika.BlockingConnection(pika.ConnectionParameters(port=leader.port))
        channel = admin.channel()
        channel.queue_declare("a10-chaos", durable=True)
        for i in range(n):
            channel.basic_publish("", "a10-chaos", str(i).encode(), pika.BasicProperties(delivery_mode=2))
        admin.close()
        cluster.wait_applied_equal()
        seen: list[int] = []
        duplicates = kills = attaches = 0
        pending: dict[bytes, int] = {}  # tag -> delivery id: accepted, the sender's settlement not seen
        deadline = time.monotonic() + 150
        while len(seen) < n or pending:
            assert time.monotonic() < deadline, f"stalled: {len(seen)} seen, {len(pending)} pending, {kills} kills"
            node = cluster.leader(timeout=20)
            raw = Raw(node.port)
            try:
                raw.login("chaos-consumer")
                _durable_receiver(raw, "a10-chaos", unsettled={tag: p.Accepted() for tag in pending} or None)
                attaches += 1
                pending = {}  # reported: the node applies those outcomes on this attach
                received = 0
                raw.send(encode_frame(p.Flow(next_incoming_id=0, incoming_window=1000, next_outgoing_id=0,
                                             outgoing_window=1000, handle=0, delivery_count=0, link_credit=10)))
                while len(seen) < n or pending:
                    frame = raw.frame(timeout=10)
                    body = frame.performative
                    if isinstance(body, p.Transfer):
                        value = int([s for s in p.decode_sections(frame.payload) if isinstance(s, p.Data)][0].value)
                        if value in seen:
                            duplicates += 1
                        else:
                            seen.append(value)
                        pending[body.delivery_tag] = body.delivery_id
                        received += 1
                        raw.send(encode_frame(p.Disposition(role=True, first=body.delivery_id, settled=False,
                                                            state=p.Accepted())))
                        if received % 5 == 0:
                            raw.send(encode_frame(p.Flow(next_incoming_id=0, incoming_window=1000,
                                                         next_outgoing_id=0, outgoing_window=1000, handle=0,
                                                         delivery_count=received, link_credit=10)))
                        if kills < len(kill_at) and len(seen) == kill_at[kills]:
                            node.kill9()
                            kills += 1
                            raise _Lost()
                    elif isinstance(body, p.Disposition) and body.settled and not body.role:
                        last = body.last if body.last is not None else body.first
                        pending = {t: d for t, d in pending.items() if not body.first <= d <= last}
            except (_Lost, EOFError, OSError):
                pass
            finally:
                raw.close()
            for dead in [x for x in cluster.nodes if not x.is_alive()]:
                dead.start()
        raw = Raw(cluster.leader(timeout=20).port)
        try:
            raw.login("chaos-consumer")
            _durable_receiver(raw, "a10-chaos")
            raw.send(encode_frame(p.Detach(handle=0, closed=True)))
            assert isinstance(raw.performative(), p.Detach)
        finally:
            raw.close()
        admin = pika.BlockingConnection(pika.ConnectionParameters(port=cluster.leader().port))
        left = admin.channel().queue_declare("a10-chaos", passive=True, durable=True).method.message_count
        admin.close()
    assert kills == 3 and attaches >= 4
    assert sorted(seen) == list(range(n)) and duplicates == 0
    assert left == 0


def test_unsettled_sender_through_repeated_leader_kills(tmp_path) -> None:
    """Issue 19: a 1.0 sender (unsettled) on the leader, which is killed -9 three times; the client
    reconnects to the new leader and resends what was not accepted.  Every accepted message is in the
    queue afterwards (a resend may add a copy: at-least-once, as with RabbitMQ)."""
    n, kill_at = 90, (20, 45, 70)
    with Cluster(3, tmp_path) as cluster:
        admin = pika.BlockingConnection(pika.ConnectionParameters(port=cluster.leader().port))
        admin.channel().queue_declare("a10-sender-chaos", durable=True)
        admin.close()
        cluster.wait_applied_equal()
        accepted: set[int] = set()
        kills = 0
        next_i = 0
        deadline = time.monotonic() + 150
        while next_i < n:
            assert time.monotonic() < deadline, f"stalled at {next_i}, {kills} kills"
            node = cluster.leader(timeout=20)
            try:
                conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=5)
            except Exception:
                continue
            try:
                sender = conn.create_sender("/queues/a10-sender-chaos")
                while next_i < n:
                    if kills < len(kill_at) and next_i == kill_at[kills]:
                        node.kill9()
                        kills += 1
                    delivery = sender.send(Message(body=str(next_i).encode(), inferred=True, durable=True))
                    if delivery.remote_state == Delivery.ACCEPTED:
                        accepted.add(next_i)
                        next_i += 1
            except Exception:  # SendException, LinkDetached, ConnectionException: the node died under the send
                pass  # resend next_i on the new leader
            finally:
                try:
                    conn.close()
                except Exception:
                    pass
            for dead in [x for x in cluster.nodes if not x.is_alive()]:
                dead.start()
        cluster.wait_applied_equal()
        admin = pika.BlockingConnection(pika.ConnectionParameters(port=cluster.leader().port))
        channel = admin.channel()
        stored = []
        while True:
            method, _props, body = channel.basic_get("a10-sender-chaos", auto_ack=True)
            if method is None:
                break
            stored.append(int(body))
        admin.close()
    assert kills == 3 and accepted == set(range(n))
    assert set(stored) >= accepted, f"lost: {sorted(accepted - set(stored))}"
