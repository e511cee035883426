"""AMQP 1.0 addressing as clients use it (issue 37): request/reply, browsing, topics and durable
subscriptions, truthful refusals, body-less messages -- python-qpid-proton 0.40 and pika against one
real raftmq node (its HTTP API on).

Sections cite the OASIS AMQP 1.0 spec (/work/shared/specs): 2.7.1 open's offered-capabilities,
3.5.3 source (dynamic, distribution-mode), 3.5.5/3.5.6 terminus durability and expiry-policy,
3.5.7 std-dist-mode, 2.6.3/2.6.6 attach refused / detach with closed, 3.2 message sections.
Every wait is bounded (proton's BlockingConnection timeout, pika's socket timeout).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import uuid

import pika
import pytest

from raftmq.client.amqp010 import Connection, SessionException
from raftmq.ops.local.node import RaftmqNode, free_port
from tests.integration.helpers import pika_params, uniq
from tests.support.http_api import call, path
from tests.support.npm import npm_cache

proton = pytest.importorskip("proton")
from proton import Message, Terminus  # noqa: E402
from proton.reactor import Copy, DurableSubscription, LinkOption  # noqa: E402
from proton.utils import BlockingConnection, LinkDetached  # noqa: E402

TIMEOUT = 10


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    http_port = free_port()
    node = RaftmqNode(tmp_path_factory.mktemp("amqp10-addr"), extra_args=["--http-port", str(http_port)])
    node.http_port = http_port
    with node:
        yield node


@pytest.fixture
def channel(node):
    conn = pika.BlockingConnection(pika_params(node.url))
    yield conn.channel()
    conn.close()


def _connect(node, **kwargs) -> BlockingConnection:
    return BlockingConnection(f"amqp://guest:guest@127.0.0.1:{node.port}", timeout=TIMEOUT, **kwargs)


@pytest.fixture
def amqp(node):
    conn = _connect(node)
    yield conn
    conn.close()


def _count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def _body(message):
    return bytes(message.body) if isinstance(message.body, memoryview) else message.body


def _bodies(receiver, n: int) -> list:
    out = []
    for _ in range(n):
        out.append(_body(receiver.receive(timeout=TIMEOUT)))  # a binary body is a view of proton's buffer
        receiver.accept()
    return out


def _routable(channel, exchange: str, key: str) -> bool:
    """Whether a mandatory publish to ``exchange``/``key`` reaches a queue (a binding exists)."""
    channel.confirm_delivery()
    try:
        channel.basic_publish(exchange, key, b"probe", mandatory=True)
    except pika.exceptions.UnroutableError:
        return False
    return True


# ---------------------------------------------------------------- request/reply (2.7.1, 3.5.3 dynamic)


def test_open_offers_anonymous_relay(amqp) -> None:
    """2.7.1: open's offered-capabilities name what we do -- ANONYMOUS-RELAY (a null-target sender
    routes by 'to') and LINK_PAIR_V1_0 (the /management link pair); not transactions."""
    offered = {str(c) for c in amqp.conn.remote_offered_capabilities or []}
    assert {"ANONYMOUS-RELAY", "LINK_PAIR_V1_0"} <= offered
    assert not any("txn" in c.lower() or "transaction" in c.lower() for c in offered)


def test_request_reply_through_dynamic_receiver(node, channel) -> None:
    """3.5.3 dynamic source as reply-to, answered through an anonymous-relay sender (null target,
    each reply's 'to' the requester's dynamic address), as Proton's server.py/client.py do."""
    service = uniq("svc")
    channel.queue_declare(service)
    server, client = _connect(node), _connect(node)
    try:
        requests = server.create_receiver(service, credit=10)
        relay = server.create_sender(None)
        replies = client.create_receiver(None, dynamic=True, credit=10)
        reply_to = replies.link.remote_source.address
        assert reply_to.startswith("/queues/amq.gen-")
        asker = client.create_sender(service)
        for i in range(3):
            asker.send(Message(body=f"q{i}", reply_to=reply_to, correlation_id=i))
        for _ in range(3):
            request = requests.receive(timeout=TIMEOUT)
            requests.accept()
            relay.send(Message(address=request.reply_to, correlation_id=request.correlation_id,
                               body=request.body.upper()))
        got = sorted((m.correlation_id, m.body) for m in (replies.receive(timeout=TIMEOUT) for _ in range(3)))
        assert got == [(0, "Q0"), (1, "Q1"), (2, "Q2")]
    finally:
        client.close()
        server.close()


# ---------------------------------------------------------------- browsing (3.5.7 copy)


def test_browse_leaves_the_queue_unchanged(channel, amqp) -> None:
    """3.5.7 copy: a browser reads every message without taking it -- twice the same five, the
    queue count unchanged, the attach reply echoing copy, deliveries pre-settled -- then a normal
    (move) receiver takes all five."""
    queue = uniq("browse")
    channel.queue_declare(queue)
    sender = amqp.create_sender(queue)
    for i in range(5):  # string bodies: a binary one is a view of a buffer proton frees on settlement
        sender.send(Message(body=f"b{i}"))
    for _ in range(2):
        browser = amqp.create_receiver(queue, credit=10, options=Copy())
        assert browser.link.remote_source.distribution_mode == Terminus.DIST_MODE_COPY
        seen = []
        for _ in range(5):
            seen.append(browser.receive(timeout=TIMEOUT).body)
        assert seen == [f"b{i}" for i in range(5)]
        browser.close()
        assert _count(channel, queue) == 5
    consumer = amqp.create_receiver(queue, credit=10)
    assert _bodies(consumer, 5) == [f"b{i}" for i in range(5)]
    consumer.close()
    assert _count(channel, queue) == 0


RHEA_DIST = r"""
const rhea = require('rhea');
const [port, queue] = process.argv.slice(1);
const c = rhea.connect({port: +port, host: '127.0.0.1', username: 'guest', password: 'guest'});
const r = c.open_receiver({source: {address: queue, distribution_mode: 'round-robin'}});
r.on('receiver_error', (ctx) => { console.log(JSON.stringify({error: ctx.receiver.error.condition,
  source: ctx.receiver.remote.attach.source || null})); process.exit(0); });
r.on('message', () => { console.log(JSON.stringify({served: true})); process.exit(0); });
setTimeout(() => { console.log(JSON.stringify({hung: true})); process.exit(0); }, 8000);
"""


def test_unknown_distribution_mode_is_refused(node, channel) -> None:
    """2.6.3 / 3.5.7: a distribution-mode other than move or copy is refused at once with
    amqp:not-implemented (a null source in the attach reply, then detach), never served as move or
    left hanging.  Sent with rhea (proton's Terminus can only name move and copy)."""
    rhea = npm_cache() / "node_modules"
    if not shutil.which("node") or not (rhea / "rhea").exists():
        pytest.skip("node and rhea (tests/integration/test_amqp10_rhea.py installs it) are needed")
    queue = uniq("dist")
    channel.queue_declare(queue)
    result = subprocess.run(["node", "-e", RHEA_DIST, str(node.port), queue], capture_output=True, text=True,
                            timeout=30, env={**os.environ, "NODE_PATH": str(rhea)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"error": "amqp:not-implemented", "source": None}


# ---------------------------------------------------------------- topics and subscriptions


def test_topic_subscription_non_durable(channel, amqp) -> None:
    """topic://name (ActiveMQ/Artemis) as a source: a queue of the receiver's own bound to amq.topic
    with the name as key (Artemis' '*' wildcard kept, ActiveMQ's '>' read as '#'); a topic:// target
    publishes to amq.topic; the subscription is gone at detach (nothing routes there any more)."""
    base = uniq("PRICE").replace("-", "")
    exact = amqp.create_receiver(f"topic://{base}.NYSE.RHT", credit=10)
    star = amqp.create_receiver(f"topic://{base}.NYSE.*", credit=10)
    multi = amqp.create_receiver(f"topic://{base}.>", credit=10)
    sender = amqp.create_sender(f"topic://{base}.NYSE.RHT")
    sender.send(Message(body="rht"))
    amqp.create_sender(f"topic://{base}.LSE.X").send(Message(body="x"))
    assert exact.receive(timeout=TIMEOUT).body == "rht"
    assert star.receive(timeout=TIMEOUT).body == "rht"
    assert sorted(_bodies(multi, 2)) == ["rht", "x"]
    exact.close()
    star.close()
    multi.close()
    assert not _routable(channel, "amq.topic", f"{base}.NYSE.RHT")


def test_exchanges_source_is_a_subscription(channel, amqp) -> None:
    """RabbitMQ 4's /exchanges/:exchange/:key as a source: a server-named exclusive auto-delete queue
    bound to that exchange with that key; /exchanges/:x without a key is refused (invalid-field), a
    missing exchange with not-found."""
    key = uniq("k")
    receiver = amqp.create_receiver(f"/exchanges/amq.topic/{key}", credit=10)
    assert receiver.link.remote_source.address == f"/exchanges/amq.topic/{key}"
    channel.basic_publish("amq.topic", key, b"via-0-9-1")
    message = receiver.receive(timeout=TIMEOUT)
    assert bytes(message.body) == b"via-0-9-1"
    receiver.accept()
    receiver.close()
    assert not _routable(channel, "amq.topic", key)
    with pytest.raises(LinkDetached):
        amqp.create_receiver("/exchanges/amq.topic", credit=1)
    with pytest.raises(LinkDetached) as missing:  # 2.6.3: a subscription to no exchange is refused at once
        amqp.create_receiver(f"/exchanges/{uniq('nx')}/k", credit=1)
    assert "not-found" in str(missing.value)


def test_durable_subscription_survives_reconnect(node, channel) -> None:
    """3.5.5/3.5.6, JMS-over-AMQP: a topic source with durable unsettled-state and expiry-policy
    never (proton's DurableSubscription) is a durable queue named by container-id and link name:
    messages published while the subscriber is away wait for it; a detach with closed=true (2.6.6)
    deletes the subscription."""
    container, name = f"c-{uuid.uuid4().hex[:8]}", "sub1"
    topic = uniq("news").replace("-", "")
    queue = f"amq.sub.{container}.{name}"
    first = _connect(node, container_id=container)
    receiver = first.create_receiver(f"topic://{topic}", name=name, credit=10, options=DurableSubscription())
    publisher = _connect(node)
    sender = publisher.create_sender(f"topic://{topic}")
    sender.send(Message(body="m0"))
    assert _bodies(receiver, 1) == ["m0"]
    first.close()  # the connection goes; the subscription stays
    for i in range(1, 4):
        sender.send(Message(body=f"m{i}"))
    publisher.close()
    assert _count(channel, queue) == 3
    second = _connect(node, container_id=container)
    try:
        receiver = second.create_receiver(f"topic://{topic}", name=name, credit=10, options=DurableSubscription())
        assert _bodies(receiver, 3) == ["m1", "m2", "m3"]
        receiver.close()  # detach closed=true: the subscription ends
    finally:
        second.close()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        channel.queue_declare(queue, passive=True)
    assert gone.value.reply_code == 404


def test_durable_configuration_subscription_detached_not_closed(node, channel) -> None:
    """3.5.5 durable configuration + expiry never: a durable subscription without durable link
    state; a detach with closed=false (2.6.6) keeps it: messages published afterwards wait in it."""
    container, name = f"c-{uuid.uuid4().hex[:8]}", "cfg"
    topic = uniq("cfg").replace("-", "")

    class Configuration(LinkOption):
        def apply(self, link) -> None:
            link.source.durability = Terminus.CONFIGURATION
            link.source.expiry_policy = Terminus.EXPIRE_NEVER

    conn = _connect(node, container_id=container)
    try:
        receiver = conn.create_receiver(f"topic://{topic}", name=name, credit=10, options=Configuration())
        queue = f"amq.sub.{container}.{name}"
        assert channel.queue_declare(queue, passive=True).method.consumer_count == 1
        receiver.link.detach()
        conn.wait(lambda: channel.queue_declare(queue, passive=True).method.consumer_count == 0, timeout=TIMEOUT)
        channel.basic_publish("amq.topic", topic, b"kept")
        assert _count(channel, queue) == 1
    finally:
        conn.close()


# ---------------------------------------------------------------- refusals


def test_stream_queues_are_refused_in_every_protocol(node, channel) -> None:
    """Until streams exist, x-queue-type=stream is refused, never made a destructive queue: 0-9-1
    queue.declare 406 PRECONDITION_FAILED, HTTP PUT /api/queues 400, 1.0 /management PUT 400, 0-10
    queue.declare execution.exception 406 (raftmq's own 0-10 client); nothing is created."""
    name = uniq("stream")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
    assert refused.value.reply_code == 406 and "streams are not supported" in refused.value.reply_text
    status, body = call(f"http://127.0.0.1:{node.http_port}", "PUT", path("queues", "/", name),
                        body={"durable": True, "arguments": {"x-queue-type": "stream"}})
    assert status == 400 and "streams are not supported" in str(body)

    class Paired(LinkOption):
        def apply(self, link) -> None:
            link.properties = {proton.symbol("paired"): True}
            link.source.address = link.target.address = "/management"
            link.snd_settle_mode = proton.Link.SND_SETTLED

    conn = _connect(node)
    try:
        sender = conn.create_sender("/management", options=Paired())
        receiver = conn.create_receiver("/management", options=Paired())
        sender.send(Message(id="r1", address=f"/queues/{name}", subject="PUT", reply_to="$me",
                            body={"durable": True, "arguments": {"x-queue-type": "stream"}}))
        answer = receiver.receive(timeout=TIMEOUT)
        assert answer.correlation_id == "r1" and answer.subject == "400"
    finally:
        conn.close()

    async def declare_010() -> int:
        conn = await Connection.connect([f"127.0.0.1:{node.port}"])
        try:
            session = await conn.session()
            with pytest.raises(SessionException) as info:
                await session.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})
            return info.value.error_code
        finally:
            await conn.close()

    assert asyncio.run(asyncio.wait_for(declare_010(), 30)) == 406  # 0-10 execution.exception precondition-failed
    fresh = pika.BlockingConnection(pika_params(node.url))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        fresh.channel().queue_declare(name, passive=True)  # nothing was created
    fresh.close()


def test_dynamic_target_is_refused(amqp) -> None:
    """3.5.4 dynamic target: not supported, so refused at once with amqp:not-implemented (before,
    the sender was silently taken as an anonymous relay)."""

    class DynamicTarget(LinkOption):
        def apply(self, link) -> None:
            link.target.address = None
            link.target.dynamic = True

    with pytest.raises(LinkDetached) as refused:
        amqp.create_sender(None, options=DynamicTarget())
    assert "not-implemented" in str(refused.value)


# ---------------------------------------------------------------- body-less messages (3.2)


def test_body_less_message_stays_body_less(channel, amqp) -> None:
    """3.2: a bare message may have no body section; it comes back without one (not an empty data
    section) to 1.0, and as an empty body to 0-9-1."""
    queue = uniq("nobody")
    channel.queue_declare(queue)
    sender = amqp.create_sender(queue)
    sender.send(Message(subject="no-body", properties={"k": 1}))  # body None: no body section
    sender.send(Message(subject="no-body-2"))
    receiver = amqp.create_receiver(queue, credit=1)
    message = receiver.receive(timeout=TIMEOUT)
    receiver.accept()
    assert message.subject == "no-body" and message.body is None and message.properties == {"k": 1}
    receiver.close()
    method, props, body = channel.basic_get(queue, auto_ack=True)
    assert method is not None and body == b""
