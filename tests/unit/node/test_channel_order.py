"""A 0-9-1 channel keeps its methods' order behind a topology change it issued (node/amqp091/channel.py
"order behind a topology change"; issue 34).

AMQP 0-9-1 general 4.7: "methods are received in the same order as they are sent" on a channel, and
4.6: a synchronous method's effects "MUST NOT be visible on the channel before the response method,
and MUST be visible thereafter"; a client may send methods without waiting for a reply (2.2.1, and
no-wait on declares, reference 1.6.2.1.8).  The front end reads the node's view of the topology before
submitting some commands (with queue groups: the groups a publish, get or consume goes to; always: the
publish's exchange check), so those wait until the change's reply came.

The channel runs here against a recording connection (no broker: what it submits, and when, is the
subject): each test checks which commands were submitted before and after the change's reply.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

from raftmq.node.amqp091.channel import Channel
from raftmq.protocol.amqp091 import methods as m
from raftmq.store.core.commands import ROUTED, DeclaredQueue, Op

WRITE_HIGH = 4096


class _Access:
    def authorize(self, command: Any) -> None:
        return None

    def require(self, *args: Any) -> None:
        return None


class _Host:
    """The connection as a channel sees it (channel.py ``ChannelHost``), recording what it is given."""

    def __init__(self, groups: int, exchanges: set[str]) -> None:
        self.submitted: list[Any] = []
        self.pending: dict[int, tuple[Any, Any]] = {}  # token -> (on_ok, command)
        self.frames: list[bytes] = []
        self.full: list[tuple[str, int]] = []
        self.broker = SimpleNamespace(machine=SimpleNamespace(vhosts={"/": SimpleNamespace(exchanges=exchanges)}),
                                      submit=lambda command, deferrable=False, size=0: self.submitted.append(command))
        self.config = SimpleNamespace(raft_groups=groups, max_message_size=1 << 20, prefetch_readahead=0,
                                      autoack_credit=0)
        self.conn_id = "c1"
        self.access = _Access()
        self.vhost = "/"
        self.frame_max = 131072
        self.is_publisher = False
        self.client_capabilities: dict = {}
        self.confirm_dirty: dict = {}
        self.write_high = WRITE_HIGH
        self.counts = [0, 0]
        self._token = 0

    def write(self, data: bytes) -> None:
        self.frames.append(data)

    def issue_token(self) -> int:
        self._token += 1
        return self._token

    def request(self, channel: Channel, command: Any, method_cls: Any, on_ok: Any, deferrable: bool = False,
                size: int = 0) -> None:
        if command.token is None:
            command = command._replace(token=self.issue_token())
        self.pending[command.token] = (on_ok, command)
        self.submitted.append(command)

    def request_publish(self, channel: Channel, command: Any, seq: int, deferrable: bool, size: int) -> None:
        self.submitted.append(command)

    def forget_channel(self, number: int) -> None:
        return None

    def hold_full(self, number: int) -> None:
        self.full.append(("full", number))

    def hold_released(self, number: int) -> None:
        self.full.append(("released", number))

    # -- for the tests
    def answer(self, op: int, value: Any) -> None:
        """The broker's OK reply to the oldest pending command of kind ``op``."""
        token = next(t for t, (_f, c) in self.pending.items() if c.op == op)
        on_ok, _command = self.pending.pop(token)
        on_ok(value)

    def ops(self) -> list[int]:
        out = [c.op for c in self.submitted]
        self.submitted.clear()
        return out

    def methods(self) -> list[str]:
        names = []
        for data in self.frames:
            pos = 0
            while pos < len(data):
                ftype, _channel, size = struct.unpack_from(">BHI", data, pos)
                if ftype == 1:
                    names.append(type(m.decode_method(data[pos + 7:pos + 7 + size])).__name__)
                pos += 8 + size
        self.frames.clear()
        return names


def opened(groups: int = 3, exchanges: set[str] | None = None) -> tuple[Channel, _Host]:
    host = _Host(groups, {""} if exchanges is None else exchanges)
    ch = Channel(host, 1)  # type: ignore[arg-type]  # the recording host in place of a connection
    ch.on_method(m.ChannelOpen())
    host.answer(Op.CHANNEL_OPEN, None)
    host.ops()
    host.methods()
    return ch, host


def publish(ch: Channel, exchange: str, key: str, body: bytes = b"x", mandatory: bool = False) -> None:
    ch.on_method(m.BasicPublish(exchange=exchange, routing_key=key, mandatory=mandatory))
    ch.on_header(struct.pack(">HHQH", 60, 0, len(body), 0))
    ch.on_body(body)


def declare(ch: Channel, queue: str, no_wait: bool = False, passive: bool = False) -> None:
    ch.on_method(m.QueueDeclare(queue=queue, no_wait=no_wait, passive=passive, arguments={}))


def test_groups_publish_and_get_wait_for_the_declare():
    """With groups, a publish and a get pipelined behind queue.declare are submitted only after the
    declare's reply, in their order, and declare-ok goes out before get's answer."""
    ch, host = opened()
    declare(ch, "q")
    publish(ch, "", "q", b"one")
    ch.on_method(m.BasicGet(queue="q", no_ack=True))
    assert host.ops() == [Op.QUEUE_DECLARE]
    host.answer(Op.QUEUE_DECLARE, DeclaredQueue("q", 0, 0))
    assert host.ops() == [Op.PUBLISH, Op.GET]
    host.answer(Op.GET, None)
    assert host.methods() == ["QueueDeclareOk", "BasicGetEmpty"]
    assert ch.held_input_bytes == 0


def test_groups_metadata_methods_pass_behind_metadata_methods():
    """Methods the metadata group orders (declare, bind, exchange.declare) are not held behind a
    declare; the first publish after them waits for all of them, in order."""
    exchanges = {""}
    ch, host = opened(exchanges=exchanges)
    ch.on_method(m.ExchangeDeclare(exchange="ex", type="direct", arguments={}))
    declare(ch, "q")
    ch.on_method(m.QueueBind(queue="q", exchange="ex", routing_key="k", arguments={}))
    publish(ch, "ex", "k")
    declare(ch, "q2")  # behind the held publish: held too (held input leaves in order)
    assert host.ops() == [Op.EXCHANGE_DECLARE, Op.QUEUE_DECLARE, Op.QUEUE_BIND]
    exchanges.add("ex")  # applied: in the view before its reply comes
    host.answer(Op.EXCHANGE_DECLARE, None)
    host.answer(Op.QUEUE_DECLARE, DeclaredQueue("q", 0, 0))
    assert host.ops() == []
    host.answer(Op.QUEUE_BIND, None)
    assert host.ops() == [Op.PUBLISH, Op.QUEUE_DECLARE]


def test_groups_nowait_declare_still_orders():
    """declare with no-wait: no declare-ok to the client, but the publish behind it still waits for
    the broker's reply (reference 1.7.2.1: no-wait only spares the client the answer)."""
    ch, host = opened()
    declare(ch, "q", no_wait=True)
    publish(ch, "", "q")
    assert host.ops() == [Op.QUEUE_DECLARE]
    host.answer(Op.QUEUE_DECLARE, DeclaredQueue("q", 0, 0))
    assert host.ops() == [Op.PUBLISH]
    assert host.methods() == []


def test_groups_redeclare_waits_for_the_delete():
    """queue.delete goes to the queue's group, not the metadata group's log: a declare of the same
    name behind it waits for delete-ok (which comes once every group forgot the queue)."""
    ch, host = opened()
    ch.on_method(m.QueueDelete(queue="q"))
    declare(ch, "q")
    assert host.ops() == [Op.QUEUE_DELETE]
    host.answer(Op.QUEUE_DELETE, 0)
    assert host.ops() == [Op.QUEUE_DECLARE]


def test_groups_consume_tx_and_close_wait():
    """basic.consume, a transaction's publish and commit, and channel.close behind a declare wait;
    the commit carries the held publish."""
    ch, host = opened()
    ch.on_method(m.TxSelect())
    declare(ch, "q")
    ch.on_method(m.BasicConsume(queue="q", consumer_tag="t", arguments={}))
    publish(ch, "", "q")
    ch.on_method(m.TxCommit())
    ch.on_method(m.ChannelClose(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    assert host.ops() == [Op.QUEUE_DECLARE]
    host.answer(Op.QUEUE_DECLARE, DeclaredQueue("q", 0, 0))
    submitted = list(host.submitted)
    assert host.ops() == [Op.CONSUME, Op.TX_COMMIT, Op.CHANNEL_CLOSE]
    commit = submitted[1]
    assert [op.op for op in commit.operations] == [Op.PUBLISH]


def test_groups_passive_declare_is_no_change():
    """A passive declare changes nothing: what follows it is not held."""
    ch, host = opened()
    declare(ch, "q", passive=True)
    ch.on_method(m.BasicGet(queue="q", no_ack=True))
    assert host.ops() == [Op.QUEUE_DECLARE, Op.GET]


def test_last_queue_is_the_declared_one_at_once():
    """An empty queue name means the last queue declared on the channel (reference 1.7.2.3): a bind
    pipelined behind a server-named declare names it, before the declare's reply."""
    ch, host = opened(groups=1, exchanges={"", "amq.direct"})
    declare(ch, "")
    ch.on_method(m.QueueBind(queue="", exchange="amq.direct", routing_key="k", arguments={}))
    declared, bound = host.submitted
    assert declared.name.startswith("amq.gen-") and bound.queue == declared.name


def test_one_group_publish_to_an_exchange_being_declared_waits():
    """One group: the log orders every command, so a get or a publish to a known exchange behind a
    declare is submitted at once; a publish to the exchange being declared waits for its reply
    (the front end's exchange check reads the view), then goes, and the get behind it after."""
    exchanges = {""}
    ch, host = opened(groups=1, exchanges=exchanges)
    ch.on_method(m.ExchangeDeclare(exchange="ex", type="fanout", arguments={}))
    publish(ch, "", "q")
    ch.on_method(m.BasicGet(queue="q", no_ack=True))
    assert host.ops() == [Op.EXCHANGE_DECLARE, Op.PUBLISH, Op.GET]
    publish(ch, "ex", "", mandatory=True)
    ch.on_method(m.BasicGet(queue="q", no_ack=True))
    assert host.ops() == []
    exchanges.add("ex")  # the declare applied: the view has it, then its reply comes
    host.answer(Op.EXCHANGE_DECLARE, None)
    assert host.ops() == [Op.PUBLISH, Op.GET]
    host.answer(Op.PUBLISH, ROUTED)
    assert host.methods() == ["ExchangeDeclareOk"]


def test_one_group_unknown_exchange_still_404_after_the_changes():
    """One group: a publish to an exchange that does not exist waits for the pending change, then is
    refused 404 as before (channel.close)."""
    ch, host = opened(groups=1)
    declare(ch, "q")
    publish(ch, "nope", "k")
    assert host.ops() == [Op.QUEUE_DECLARE]
    host.answer(Op.QUEUE_DECLARE, DeclaredQueue("q", 0, 0))
    assert host.methods() == ["QueueDeclareOk", "ChannelClose"]
    assert host.ops() == [Op.CHANNEL_CLOSE]


def test_held_input_is_bounded_then_released():
    """A flood behind a change never answered is held up to write_buffer_high, then the connection
    is told to stop reading (hold_full) once; the reply releases it all in order (hold_released)."""
    ch, host = opened()
    declare(ch, "q")
    for _ in range(WRITE_HIGH // 1000 + 2):
        publish(ch, "", "q", b"b" * 1000)
    assert host.ops() == [Op.QUEUE_DECLARE]
    assert host.full == [("full", 1)]
    assert ch.held_input_bytes > WRITE_HIGH
    host.answer(Op.QUEUE_DECLARE, DeclaredQueue("q", 0, 0))
    assert host.ops() == [Op.PUBLISH] * (WRITE_HIGH // 1000 + 2)
    assert host.full == [("full", 1), ("released", 1)]
    assert ch.held_input_bytes == 0


def test_refused_change_drops_the_held_input_and_answers_a_held_close():
    """The change is refused (channel error): the channel closes, nothing held runs, and a client
    channel.close held behind it is answered with close-ok (reference 1.5.2.5, closing channels)."""
    ch, host = opened()
    declare(ch, "q")
    publish(ch, "", "q")
    ch.on_method(m.ChannelClose(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    host.ops()
    ch.fail_from_broker(406, "PRECONDITION_FAILED - inequivalent arg", m.QueueDeclare)
    assert host.ops() == [Op.CHANNEL_CLOSE]  # the core's side of the close, nothing held
    assert host.methods() == ["ChannelClose", "ChannelCloseOk"]
    assert ch.held_input_bytes == 0


def test_change_made_by_a_released_method_holds_the_rest_again():
    """A declare released from the held input is itself a change: what follows it waits for it."""
    ch, host = opened()
    ch.on_method(m.QueueDelete(queue="q"))
    declare(ch, "q")
    publish(ch, "", "q")
    assert host.ops() == [Op.QUEUE_DELETE]
    host.answer(Op.QUEUE_DELETE, 0)
    assert host.ops() == [Op.QUEUE_DECLARE]
    host.answer(Op.QUEUE_DECLARE, DeclaredQueue("q", 0, 0))
    assert host.ops() == [Op.PUBLISH]
