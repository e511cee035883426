"""Every operation x every protocol x permitted/refused: one permission table, checked end to end.

Three users each lack exactly one of RabbitMQ's three permissions (configure, write, read) in vhost
"/", and have the other two for every name.  Each row of ``OPERATIONS_091`` / ``OPERATIONS_010``
names the permissions an operation needs; an operation must succeed for the users that have all of
them and be refused with 403 for the others -- with nothing changed (the queue still there, its
messages still queued).  So the table says *which* permission each operation checks, not only that
some check exists.

* AMQP 0-9-1 (pika): 403 access-refused is a channel exception (reference 1.2, "access-refused");
  the connection stays open.  The same rows run against RabbitMQ (``RAFTMQ_TEST_BROKER=rabbitmq``),
  the reference for the rules themselves, passive declares included (RabbitMQ checks nothing
  beyond vhost access for them).
* AMQP 0-10 (raftmq's client): execution.exception with error-code 403 unauthorized-access ("the
  client attempted to work with a server entity to which it has no access due to security
  settings", 0-10 spec, execution.error-code), after which the session is detached (3.4.1.3).
  0-10's queries (no 0-9-1 counterpart) need read on what they inspect (node/core/access.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pika.exceptions as pex
import pytest

from raftmq.client.amqp010 import Connection, SessionException
from raftmq.ops.local.node import RaftmqNode
from raftmq.protocol.amqp010 import codec as c
from tests.integration.helpers import connect, message_count, uniq

CONFIGURE, WRITE, READ = "configure", "write", "read"
KINDS = (CONFIGURE, WRITE, READ)
NOTHING = "^ungranted-only$"  # a pattern no resource in these tests matches
# RabbitMQ's reading of patterns: searched, not matched whole ("perm" grants "xperm-1"); the empty
# pattern grants nothing; the default exchange is "amq.default" to permissions.
PATTERNS_USER = ("perm", r"^amq\.default$", "")


@dataclass(frozen=True)
class Users:
    host: str
    port: int
    kind: str  # "raftmq" or "rabbitmq"
    password: str
    names: dict[str, str]  # the permission a user lacks -> its name

    def url(self, lacking: str) -> str:
        return f"amqp://{self.names[lacking]}:{self.password}@{self.host}:{self.port}/%2F"

    @property
    def admin_url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"


def _patterns(lacking: str) -> tuple[str, str, str]:
    if lacking == "patterns":
        return PATTERNS_USER
    return tuple(NOTHING if kind == lacking else ".*" for kind in KINDS)  # type: ignore[return-value]


@pytest.fixture(scope="module")
def users(broker_kind, request, tmp_path_factory) -> Iterator[Users]:
    suffix = uuid.uuid4().hex[:8]
    password = f"pw-{suffix}"
    names = {kind: f"no{kind}-{suffix}" for kind in (*KINDS, "patterns")}
    if broker_kind == "rabbitmq":
        broker = request.getfixturevalue("broker")
        rmq = broker.process
        for kind, name in names.items():
            rmq.ctl("add_user", name, password)
            rmq.ctl("set_permissions", "-p", "/", name, *_patterns(kind))
        yield Users(broker.host, broker.port, "rabbitmq", password, names)
        for name in names.values():
            rmq.ctl("delete_user", name)
        return
    base = Path(tmp_path_factory.mktemp("permissions"))
    toml = "disk_free_limit = 1\n\n[users.guest]\npassword = \"guest\"\nloopback_only = true\n"
    for kind, name in names.items():
        conf, write, read = _patterns(kind)
        toml += (f"\n[users.{name}]\npassword = \"{password}\"\n"
                 f"permissions = {{ \"/\" = ['{conf}', '{write}', '{read}'] }}\n")  # TOML literal strings
    (base / "raftmq.toml").write_text(toml)
    node = RaftmqNode(base / "data", config=base / "raftmq.toml").start()
    try:
        yield Users(node.host, node.port, "raftmq", password, names)
    finally:
        node.terminate()


@dataclass
class World:
    """Resources made by guest for one case, and what must still hold when the case was refused."""

    admin: pika.adapters.blocking_connection.BlockingChannel
    queue: str = field(default_factory=lambda: uniq("perm-q"))
    exchange: str = field(default_factory=lambda: uniq("perm-x"))
    other_exchange: str = field(default_factory=lambda: uniq("perm-x2"))
    fresh: str = field(default_factory=lambda: uniq("perm-new"))

    def make_queue(self, messages: int = 0) -> None:
        self.admin.queue_declare(self.queue, auto_delete=False)
        for _ in range(messages):
            self.admin.basic_publish("", self.queue, b"kept")

    def make_exchanges(self) -> None:
        self.admin.exchange_declare(self.exchange, "direct")
        self.admin.exchange_declare(self.other_exchange, "direct")

    def exists(self, kind: str, name: str) -> bool:
        ch = self.admin.connection.channel()
        try:
            if kind == "queue":
                ch.queue_declare(name, passive=True)
            else:
                ch.exchange_declare(name, passive=True)
        except pex.ChannelClosedByBroker as exc:
            assert exc.reply_code == 404, exc
            return False
        ch.close()
        return True

    def cleanup(self) -> None:
        for name in (self.queue, self.fresh):
            self.admin.queue_delete(name)
        for name in (self.exchange, self.other_exchange, self.fresh):
            self.admin.exchange_delete(name)


@dataclass(frozen=True)
class Operation:
    name: str
    needs: frozenset[str]
    setup: Callable[[World], None]
    act: Callable  # (channel or 0-10 session, World) -> None (a coroutine function for 0-10)
    unchanged: Callable[[World], bool] = lambda world: True  # checked after a refusal


def _queue_with(messages: int = 0) -> Callable[[World], None]:
    return lambda w: w.make_queue(messages)


def _queue_and_exchanges(bound: bool) -> Callable[[World], None]:
    def setup(w: World) -> None:
        w.make_queue()
        w.make_exchanges()
        if bound:
            w.admin.queue_bind(w.queue, w.exchange, "k")
            w.admin.exchange_bind(w.exchange, w.other_exchange, "k")
    return setup


def _nothing(w: World) -> None:
    return None


def _refused_publish_stored_nothing(w: World) -> bool:
    return message_count(w.admin, w.queue) == 0


OPERATIONS_091 = [
    Operation("queue.declare", frozenset({CONFIGURE}), _nothing,
              lambda ch, w: ch.queue_declare(w.fresh), lambda w: not w.exists("queue", w.fresh)),
    Operation("queue.declare passive", frozenset(), _queue_with(0),
              lambda ch, w: ch.queue_declare(w.queue, passive=True)),
    Operation("queue.declare with a dead-letter exchange", frozenset({CONFIGURE, WRITE, READ}),
              _queue_and_exchanges(False),
              lambda ch, w: ch.queue_declare(w.fresh, arguments={"x-dead-letter-exchange": w.exchange}),
              lambda w: not w.exists("queue", w.fresh)),
    Operation("queue.delete", frozenset({CONFIGURE}), _queue_with(0),
              lambda ch, w: ch.queue_delete(w.queue), lambda w: w.exists("queue", w.queue)),
    Operation("queue.purge", frozenset({READ}), _queue_with(2),
              lambda ch, w: ch.queue_purge(w.queue), lambda w: message_count(w.admin, w.queue) == 2),
    Operation("queue.bind", frozenset({WRITE, READ}), _queue_and_exchanges(False),
              lambda ch, w: ch.queue_bind(w.queue, w.exchange, "k")),
    Operation("queue.unbind", frozenset({WRITE, READ}), _queue_and_exchanges(True),
              lambda ch, w: ch.queue_unbind(w.queue, w.exchange, "k")),
    # Issue 32: an unbind naming a queue or exchange that does not exist is unbind-ok (RabbitMQ's
    # rabbit_binding:remove), but its permissions are checked by name first, as RabbitMQ's
    # rabbit_channel does before the lookup: write on the queue (destination), read on the source.
    Operation("queue.unbind of a missing queue", frozenset({WRITE, READ}), _queue_and_exchanges(False),
              lambda ch, w: ch.queue_unbind(w.fresh, w.exchange, "k")),
    Operation("queue.unbind from a missing exchange", frozenset({WRITE, READ}), _queue_and_exchanges(False),
              lambda ch, w: ch.queue_unbind(w.queue, w.fresh, "k")),
    Operation("exchange.declare", frozenset({CONFIGURE}), _nothing,
              lambda ch, w: ch.exchange_declare(w.fresh, "fanout"), lambda w: not w.exists("exchange", w.fresh)),
    Operation("exchange.declare passive", frozenset(), _queue_and_exchanges(False),
              lambda ch, w: ch.exchange_declare(w.exchange, "direct", passive=True)),
    Operation("exchange.declare with an alternate exchange", frozenset({CONFIGURE, WRITE, READ}),
              _queue_and_exchanges(False),
              lambda ch, w: ch.exchange_declare(w.fresh, "fanout", arguments={"alternate-exchange": w.exchange}),
              lambda w: not w.exists("exchange", w.fresh)),
    Operation("exchange.delete", frozenset({CONFIGURE}), _queue_and_exchanges(False),
              lambda ch, w: ch.exchange_delete(w.exchange), lambda w: w.exists("exchange", w.exchange)),
    Operation("exchange.bind", frozenset({WRITE, READ}), _queue_and_exchanges(False),
              lambda ch, w: ch.exchange_bind(w.exchange, w.other_exchange, "k")),
    Operation("exchange.unbind", frozenset({WRITE, READ}), _queue_and_exchanges(True),
              lambda ch, w: ch.exchange_unbind(w.exchange, w.other_exchange, "k")),
    Operation("exchange.unbind of a missing destination", frozenset({WRITE, READ}), _queue_and_exchanges(False),
              lambda ch, w: ch.exchange_unbind(w.fresh, w.other_exchange, "k")),
    Operation("basic.publish", frozenset({WRITE}), _queue_and_exchanges(True),
              lambda ch, w: (ch.confirm_delivery(), ch.basic_publish(w.exchange, "k", b"m")),
              _refused_publish_stored_nothing),
    Operation("basic.consume", frozenset({READ}), _queue_with(0),
              lambda ch, w: ch.basic_consume(w.queue, lambda *_: None)),
    Operation("basic.get", frozenset({READ}), _queue_with(1),
              lambda ch, w: ch.basic_get(w.queue, auto_ack=False),
              lambda w: message_count(w.admin, w.queue) == 1),
]


@dataclass
class Outcome:
    refused: bool
    code: int | None = None
    text: str = ""


def _attempt_091(users: Users, lacking: str, op: Operation, world: World) -> Outcome:
    conn = connect(users.url(lacking))
    try:
        op.act(conn.channel(), world)
        outcome = Outcome(False)
    except pex.ChannelClosedByBroker as exc:
        outcome = Outcome(True, exc.reply_code, exc.reply_text)
    assert conn.is_open, "a 403 is a channel exception: the connection stays open (reference 1.2)"
    conn.close()
    return outcome


def _check_row(users: Users, lacking: str, op: Operation, attempt: Callable, refusal_says: str) -> None:
    """Set the row's world up as guest, attempt the operation as the user lacking ``lacking``: refused
    with 403 (and nothing changed) exactly when the operation needs that permission."""
    admin_conn = connect(users.admin_url)
    world = World(admin_conn.channel())
    try:
        op.setup(world)
        outcome = attempt(users, lacking, op, world)
        if lacking in op.needs:
            assert outcome.refused and outcome.code == 403, (op.name, lacking, outcome)
            assert refusal_says in outcome.text, outcome
            assert op.unchanged(world), f"{op.name} was refused but changed the broker's state"
        else:
            assert not outcome.refused, (op.name, lacking, outcome)
    finally:
        world.cleanup()
        admin_conn.close()


@pytest.mark.parametrize("lacking", KINDS)
@pytest.mark.parametrize("op", OPERATIONS_091, ids=lambda op: op.name)
def test_amqp091_permission_table(users, op: Operation, lacking: str):
    _check_row(users, lacking, op, _attempt_091, "ACCESS_REFUSED - ")


# -- AMQP 0-10 ---------------------------------------------------------------------------------------------
async def _publish_010(session, w: World) -> None:
    await session.publish(w.exchange, "k", b"m")


def _cmd(make: Callable[[World], c.Command]):
    async def act(session, w: World) -> None:
        await session.execute(make(w))
    return act


OPERATIONS_010 = [
    Operation("queue.declare", frozenset({CONFIGURE}), _nothing,
              _cmd(lambda w: c.QueueDeclare(queue=w.fresh)), lambda w: not w.exists("queue", w.fresh)),
    Operation("queue.declare passive", frozenset(), _queue_with(0),
              _cmd(lambda w: c.QueueDeclare(queue=w.queue, passive=True))),
    Operation("queue.declare with an alternate exchange", frozenset({CONFIGURE, WRITE, READ}),
              _queue_and_exchanges(False),
              _cmd(lambda w: c.QueueDeclare(queue=w.fresh, alternate_exchange=w.exchange)),
              lambda w: not w.exists("queue", w.fresh)),
    Operation("queue.delete", frozenset({CONFIGURE}), _queue_with(0),
              _cmd(lambda w: c.QueueDelete(queue=w.queue)), lambda w: w.exists("queue", w.queue)),
    Operation("queue.purge", frozenset({READ}), _queue_with(2),
              _cmd(lambda w: c.QueuePurge(queue=w.queue)), lambda w: message_count(w.admin, w.queue) == 2),
    Operation("queue.query", frozenset({READ}), _queue_with(1),
              _cmd(lambda w: c.QueueQuery(queue=w.queue))),
    Operation("exchange.bind", frozenset({WRITE, READ}), _queue_and_exchanges(False),
              _cmd(lambda w: c.ExchangeBind(queue=w.queue, exchange=w.exchange, binding_key="k"))),
    Operation("exchange.unbind", frozenset({WRITE, READ}), _queue_and_exchanges(True),
              _cmd(lambda w: c.ExchangeUnbind(queue=w.queue, exchange=w.exchange, binding_key="k"))),
    Operation("exchange.declare", frozenset({CONFIGURE}), _nothing,
              _cmd(lambda w: c.ExchangeDeclare(exchange=w.fresh, type="fanout")),
              lambda w: not w.exists("exchange", w.fresh)),
    Operation("exchange.declare passive", frozenset(), _queue_and_exchanges(False),
              _cmd(lambda w: c.ExchangeDeclare(exchange=w.exchange, type="direct", passive=True))),
    Operation("exchange.declare with an alternate exchange", frozenset({CONFIGURE, WRITE, READ}),
              _queue_and_exchanges(False),
              _cmd(lambda w: c.ExchangeDeclare(exchange=w.fresh, type="fanout", alternate_exchange=w.exchange)),
              lambda w: not w.exists("exchange", w.fresh)),
    Operation("exchange.delete", frozenset({CONFIGURE}), _queue_and_exchanges(False),
              _cmd(lambda w: c.ExchangeDelete(exchange=w.exchange)), lambda w: w.exists("exchange", w.exchange)),
    Operation("exchange.query", frozenset({READ}), _queue_and_exchanges(False),
              _cmd(lambda w: c.ExchangeQuery(name=w.exchange))),
    Operation("exchange.bound", frozenset({READ}), _queue_and_exchanges(True),
              _cmd(lambda w: c.ExchangeBound(exchange=w.exchange, queue=w.queue, binding_key="k"))),
    Operation("message.transfer", frozenset({WRITE}), _queue_and_exchanges(True), _publish_010,
              _refused_publish_stored_nothing),
    Operation("message.subscribe", frozenset({READ}), _queue_with(0),
              _cmd(lambda w: c.MessageSubscribe(queue=w.queue, destination="d", accept_mode=0, acquire_mode=0))),
    Operation("message.transfer in a transaction", frozenset({WRITE}), _queue_and_exchanges(True),
              None, _refused_publish_stored_nothing),  # act: see _transactional_publish
]


async def _transactional_publish(session, w: World) -> None:
    """A refused transfer inside tx.select is refused when it is sent, not at tx.commit."""
    await session.execute(c.TxSelect())
    await session.publish(w.exchange, "k", b"m")
    await session.execute(c.TxCommit())


async def _attempt_010(users: Users, lacking: str, op: Operation, world: World) -> Outcome:
    act = op.act or _transactional_publish
    conn = await Connection.connect([f"{users.host}:{users.port}"], users.names[lacking], users.password)
    try:
        session = await conn.session()
        try:
            await asyncio.wait_for(act(session, world), 10)
        except SessionException as exc:
            return Outcome(True, exc.error_code, exc.description or "")
        # The connection still works for a new session after a refusal (only the session ended).
        return Outcome(False)
    finally:
        await conn.close()


@pytest.mark.parametrize("lacking", KINDS)
@pytest.mark.parametrize("op", OPERATIONS_010, ids=lambda op: op.name)
def test_amqp010_permission_table(users, op: Operation, lacking: str):
    if users.kind != "raftmq":
        pytest.skip("AMQP 0-10 is raftmq's")
    _check_row(users, lacking, op, lambda *args: asyncio.run(_attempt_010(*args)), "refused for user")


def test_amqp010_refusal_ends_only_the_session(users):
    """After a 403 the session is detached (3.4.1.3), the connection stays usable: a new session of
    the same connection is served."""
    if users.kind != "raftmq":
        pytest.skip("AMQP 0-10 is raftmq's")
    admin_conn = connect(users.admin_url)
    world = World(admin_conn.channel())
    world.make_queue(1)

    async def scenario() -> int:
        conn = await Connection.connect([f"{users.host}:{users.port}"], users.names[READ], users.password)
        try:
            first = await conn.session()
            with pytest.raises(SessionException) as info:
                await first.execute(c.QueuePurge(queue=world.queue))
            assert info.value.error_code == 403
            second = await conn.session()
            await second.publish("", world.queue, b"allowed: write on the default exchange")
            return 2
        finally:
            await conn.close()

    try:
        assert asyncio.run(asyncio.wait_for(scenario(), 20)) == 2
        assert message_count(world.admin, world.queue) == 2
    finally:
        world.cleanup()
        admin_conn.close()


# -- how patterns read ---------------------------------------------------------------------------------------
def test_amqp091_patterns_are_searched_and_the_default_exchange_is_amq_default(users):
    """configure "perm" grants any name containing it; write "^amq\\.default$" grants publishing to the
    default exchange only; read "" grants nothing; a refused publish to the default exchange names
    amq.default.  Checked against RabbitMQ (rabbit_auth_backend_internal reads patterns this way)."""
    admin_conn = connect(users.admin_url)
    world = World(admin_conn.channel())
    queue = uniq("xperm")
    conn = connect(users.url("patterns"))
    try:
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(queue)
        ch.basic_publish("", queue, b"to the default exchange")
        assert message_count(world.admin, queue) == 1
        for refused, names in ((lambda c: c.basic_publish("amq.direct", queue, b"x"), "exchange 'amq.direct'"),
                               (lambda c: c.basic_get(queue), f"queue '{queue}'")):
            c = conn.channel()
            c.confirm_delivery()
            with pytest.raises(pex.ChannelClosedByBroker) as info:
                refused(c)
            assert info.value.reply_code == 403 and names in info.value.reply_text, info.value
        no_write = connect(users.url(WRITE))
        try:
            c = no_write.channel()
            c.confirm_delivery()
            with pytest.raises(pex.ChannelClosedByBroker) as info:
                c.basic_publish("", queue, b"x")
            assert info.value.reply_code == 403 and "exchange 'amq.default'" in info.value.reply_text
        finally:
            no_write.close()
        assert message_count(world.admin, queue) == 1
    finally:
        conn.close()
        world.admin.queue_delete(queue)
        admin_conn.close()


def test_amqp010_patterns_read_as_in_0_9_1(users):
    if users.kind != "raftmq":
        pytest.skip("AMQP 0-10 is raftmq's")
    admin_conn = connect(users.admin_url)
    admin = admin_conn.channel()
    queue = uniq("xperm")

    async def scenario() -> list[int]:
        conn = await Connection.connect([f"{users.host}:{users.port}"], users.names["patterns"], users.password)
        codes = []
        try:
            session = await conn.session()
            await session.queue_declare(queue)
            await session.publish("", queue, b"to the default exchange")
            for refused in (lambda s: s.publish("amq.direct", queue, b"x"),
                            lambda s: s.execute(c.QueuePurge(queue=queue))):
                session = await conn.session()
                with pytest.raises(SessionException) as info:
                    await refused(session)
                codes.append(info.value.error_code)
            return codes
        finally:
            await conn.close()

    try:
        assert asyncio.run(asyncio.wait_for(scenario(), 20)) == [403, 403]
        assert message_count(admin, queue) == 1
    finally:
        admin.queue_delete(queue)
        admin_conn.close()
