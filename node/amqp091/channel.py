"""One AMQP 0-9-1 channel: methods in, broker commands out; replies, deliveries and confirms back.

Replies to synchronous methods are sent strictly in request order: each request takes a slot in
``_replies`` that its result (or a local answer) fills, and slots leave only from the front. A
mandatory publish takes a slot too (filled with its basic.return, or nothing), and the confirms
gathered so far go out ahead of any reply, so returns and confirms precede the reply to every later
method on the channel, channel.close-ok included, as in RabbitMQ. Delivery tags are this channel's;
the broker core knows deliveries as (queue id, entry sequence) pairs.

A client may pipeline methods behind a topology change (declare, bind, delete...) without waiting
for its -ok, and AMQP 0-9-1 processes a channel's methods in order (general 4.7; 4.6: a synchronous
method's effects are visible after its response).  The log orders the commands themselves, but the
front end reads the node's *view* of the topology before submitting some of them: which exchange
exists (a publish's 404, here), and with queue groups (issue 34) which groups a publish, get,
consume or queue operation goes to.  So such a command waits, *held*, behind a change this channel
issued until that change's reply came (then the view includes it) -- see "Order behind a topology
change" below.
"""

from __future__ import annotations

import base64
import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from raftmq.protocol.amqp091 import methods as m
from raftmq.protocol.amqp091.errors import AMQPError
from raftmq.protocol.amqp091.frames import WholePublish, encode_content, encode_delivery, encode_method_frame
from raftmq.protocol.amqp091.properties import decode_content_header, peek_properties
from raftmq.store.core.commands import (
    NOT_HERE,
    OK,
    REJECTED,
    UNROUTABLE,
    Ack,
    Cancel,
    ChannelClose,
    ChannelOpen,
    Command,
    Consume,
    ExchangeBind,
    ExchangeDeclare,
    ExchangeDelete,
    ExchangeUnbind,
    Flow,
    Get,
    Nack,
    Op,
    Publish,
    Qos,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueUnbind,
    Recover,
    SessionWindowCredit,
    TxCommit,
)
from raftmq.store.core.delivery import AUTOACK_CREDIT
from raftmq.store.core.errors import HARD_ERRORS
from raftmq.store.core.message import AMQP091, properties_in
from raftmq.store.core.model import Message
from raftmq.store.core.values import to_plain
from raftmq.store.disk.bodies import READ_AHEAD

from ..core.access import WRITE, AccessRefused
from .autoack import MIN_SLICE, AutoAckCredit
from .errors import ChannelException, ConnectionException
from .window import ClientWindow, assigned_window

# Unconfirmed publishes beyond which a confirm-mode publisher is pipelining: it is not waiting for
# this publish's confirm, so the publish may wait ``raft_defer_seconds`` in the log for company
# (raft/cluster.py).  A publisher that waits for each confirm, or for a few, is never held back.
# Measured with aio-pika (window 1,000) through a follower: the client, CPU-bound, only ever had
# ~20-40 publishes unconfirmed (rate x commit latency), so a threshold near the window would never
# apply; at 8, batches per 20k publishes fell from ~1,050 to ~620, the client's preemptions from
# ~1,070 to ~700 a second, and it confirmed ~14 % more (paired runs, median of 10).
AMPLE_UNCONFIRMED = 8

_new_tuple = tuple.__new__

# Methods whose command goes to the metadata group's log (with queue groups, issue 34), in order with
# the topology changes before it: they need not wait for an earlier change's reply (node/groups.py).
_META_METHODS = frozenset((m.ExchangeDeclare, m.ExchangeDelete, m.ExchangeBind, m.ExchangeUnbind, m.QueueDeclare,
                           m.QueueBind, m.QueueUnbind))
# What a held method counts against the channel's bound on held input (a publish: its bytes).
HELD_METHOD_BYTES = 64
# Kinds of topology change a request is (``Channel._request``): none, one the metadata group orders
# (a declare, bind...), one it does not (queue.delete goes to the queue's group first).
NO_CHANGE, META_CHANGE, QUEUE_DELETE = 0, 1, 2

if TYPE_CHECKING:
    from ..broker import Broker
    from ..config import Config
    from ..core.access import Access


@dataclass(slots=True)
class _Order:
    """A channel's state for keeping its order behind the topology changes it issued (Channel
    ``_must_wait``), in one object of its own: a channel's attributes stay within CPython 3.11's 30
    keys of an instance's shared dictionary, beyond which every attribute read of the channel is
    slower (+50-120 ns per publish measured with them on the channel, bench/channel_hold.py)."""

    groups: bool  # raft_groups > 1
    changing: int = 0  # topology changes submitted whose reply has not come
    deleting: int = 0  # of which queue.deletes (with groups not ordered by the metadata group)
    held: deque[tuple] | None = None  # (handler, method) or (None, publish arguments), in order
    held_bytes: int = 0
    held_full: bool = False  # the connection was told to stop reading (hold_full)


class ChannelHost(Protocol):
    """What a channel uses of its connection (connection.py's ``Amqp091Connection``, checked there):
    an interface, so that this module, which the connection imports, does not import it back."""

    broker: Broker
    config: Config
    conn_id: str | None
    access: Access | None  # set by connection.open
    vhost: str
    frame_max: int
    is_publisher: bool
    client_capabilities: dict
    confirm_dirty: dict[int, Channel]  # channels with confirms to flush
    write_high: int
    counts: list[int]  # [published, delivered]

    def write(self, data: bytes) -> None: ...

    def issue_token(self) -> int: ...

    def request(self, channel: Channel, command: Command, method_cls, on_ok, deferrable: bool = False,
                size: int = 0) -> None: ...

    def request_publish(self, channel: Channel, command: Publish, seq: int, deferrable: bool,
                        size: int) -> None: ...

    def forget_channel(self, number: int) -> None: ...

    def hold_full(self, number: int) -> None: ...

    def hold_released(self, number: int) -> None: ...

BASIC_CLASS_ID = 60

# Channel states.  CLOSED: close-ok sent to the client; nothing more goes out on this object.
OPENING, OPEN, CLOSING_BY_SERVER, CLOSING_BY_CLIENT, CLOSED = range(5)


def _held_size(handler, item) -> int:
    """What a held method or publish counts against the bound of held input."""
    return HELD_METHOD_BYTES if handler is not None else 32 + len(item[3]) + len(item[4])


def _server_queue_name() -> str:
    return "amq.gen-" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


class Channel:
    def __init__(self, conn: ChannelHost, number: int) -> None:
        self.conn = conn
        self.number = number
        self.state = OPENING
        self._replies: deque[list] = deque()
        self.last_queue = ""
        # Content assembly for basic.publish.
        self._publish: m.BasicPublish | None = None
        self._props = b""
        self._body_size = 0
        self._body_parts: list[bytes] = []
        self._body_received = 0
        # Deliveries.
        self._next_delivery_tag = 0
        self._unacked: dict[int, tuple[int, int]] = {}
        self._consumers: dict[str, bool] = {}  # consumer tag -> no_ack
        self._autoack: dict[str, AutoAckCredit] = {}  # auto-ack consumers' credit (autoack.py)
        self._window = ClientWindow()  # the client's basic.qos, and deliveries held beyond it
        self._paused = False  # channel.flow active=false
        # Publisher confirms.
        self.confirm_mode = False
        self._publish_seq = 0
        self._unconfirmed = 0  # publishes submitted whose outcome has not come back
        self._confirms: list[tuple[int, bool]] = []  # (seq, ack?) waiting for flush
        # Every confirm up to this sequence number was sent; outcomes that came before an earlier
        # publish's (queue groups, issue 34) wait in _confirms_held until it comes (flush_confirms).
        self._answered_through = 0
        self._confirms_held: dict[int, bool] = {}
        # Transactions.
        self.tx_mode = False
        self._tx_ops: list[list] = []
        self._tx_returns: list[tuple] = []
        self._tx_acked: dict[int, tuple[int, int]] = {}
        # Order behind a topology change (see the module docstring and _must_wait).
        self._order = _Order(conn.config.raft_groups > 1)
        self._gated = False  # changes in flight or input held: one attribute read per method and publish

    # ------------------------------------------------------------------ state

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    @property
    def accepts_replies(self) -> bool:
        return self.state in (OPEN, OPENING, CLOSING_BY_CLIENT)

    def _command(self, kind: type, *args) -> Any:
        """A ``kind`` command (store/core/commands.py) from this channel, its token left for the request."""
        return kind(self.conn.conn_id, None, self.number, *args)

    def _slot(self) -> list:
        slot = [False, None, None]  # filled?, frames, the publish confirm (seq, ack?) to send after them
        self._replies.append(slot)
        return slot

    def _fill(self, slot: list, frames: bytes | None, confirm: tuple[int, bool] | None = None) -> None:
        slot[0], slot[1], slot[2] = True, frames, confirm
        replies = self._replies
        while replies and replies[0][0]:
            self._send_slot(replies.popleft())

    def _send_slot(self, slot: list) -> None:
        _filled, data, confirm = slot
        if data:
            if self._confirms:  # outcomes already known come first (log order)
                self.flush_confirms()
            self.conn.write(data)
        if confirm is not None:
            self._confirms.append(confirm)
            self.conn.confirm_dirty[self.number] = self

    def _reply_local(self, method) -> None:
        self._fill(self._slot(), encode_method_frame(self.number, method))

    def _request(self, command: Command, method, on_ok, no_wait: bool = False, change: int = NO_CHANGE) -> None:
        """Authorize and submit ``command``; ``on_ok(value)`` returns the reply method (or None) to
        send in order.  ``change``: the command changes the topology (META_CHANGE, QUEUE_DELETE):
        what this channel sends after it may wait for its reply (_must_wait), no_wait or not."""
        self._authorize(command)
        if change:
            self._order.changing += 1
            self._gated = True
            if change == QUEUE_DELETE:
                self._order.deleting += 1
        if no_wait:
            def answered(value):
                on_ok(value)
                if change:
                    self._changed(change)

            self.conn.request(self, command, type(method), answered)
            return
        slot = self._slot()

        def done(value):
            reply = on_ok(value)
            self._fill(slot, encode_method_frame(self.number, reply) if reply is not None else None)
            if change:
                self._changed(change)

        self.conn.request(self, command, type(method), done)

    # ------------------------------------------------------------------ errors

    def fail(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        """A channel exception: channel.close to the client; ignore everything until close-ok."""
        if code in HARD_ERRORS:
            raise ConnectionException(code, text, class_id, method_id)
        if self.state in (CLOSING_BY_SERVER, CLOSING_BY_CLIENT):
            return
        self.state = CLOSING_BY_SERVER
        self._reset_local_state()
        self._replies.clear()
        order = self._order
        order.changing = order.deleting = 0  # (no reply reaches a channel closing by the server)
        held, order.held = order.held, None
        self._gated = False
        self.conn.write(encode_method_frame(self.number, m.ChannelClose(
            reply_code=code, reply_text=text[:255], class_id=class_id, method_id=method_id)))
        # The core closes its side of the channel itself when the error came from apply; when the
        # error is ours, tell it (idempotent either way).
        self.conn.broker.submit(self._command(ChannelClose))
        if held:
            self._drop_held(held)

    def fail_from_broker(self, code: int, text: str, method_cls) -> None:
        class_id = method_cls.CLASS_ID if method_cls is not None else 0
        method_id = method_cls.METHOD_ID if method_cls is not None else 0
        self.fail(code, text, class_id, method_id)

    def _reset_local_state(self) -> None:
        self._publish = None
        self._body_parts = []
        self._unacked.clear()
        self._consumers.clear()
        self._autoack.clear()
        self._window = ClientWindow()
        self._confirms.clear()
        self._unconfirmed = 0
        self._tx_ops.clear()
        self._tx_returns.clear()
        self._tx_acked.clear()

    # ------------------------------------------------------------------ order behind a topology change

    def _must_wait(self, handler, item) -> bool:
        """Whether a method (``handler`` and the method) or a complete publish (``handler`` None, its
        ``_submit_publish`` arguments) must wait for the topology changes this channel has
        submitted and not yet seen answered (``_Order.changing`` > 0).

        With queue groups the router picks a command's groups from the node's view: everything
        waits except a method that goes to the metadata group (``_META_METHODS``), whose log orders
        it after the changes before it -- unless a queue.delete is among them (it goes to the
        queue's group first; a redeclare must find the queue gone).  With one group the log orders
        every command, and the only read of the view before it is the publish's exchange check: a
        publish waits when its exchange is not in the view yet (an exchange.declare on its way)."""
        if self._order.groups:
            return handler is None or type(item) not in _META_METHODS or self._order.deleting > 0
        if handler is not None:
            return False
        vhost = self.conn.broker.machine.vhosts.get(self.conn.vhost)
        return vhost is None or item[0] not in vhost.exchanges

    def _hold(self, handler, item) -> bool:
        """Hold this method or publish if it must wait, or if anything is held already (held input
        leaves in order).  The held input is bounded: beyond the connection's write_buffer_high
        (the bound of its parked deliveries) the connection stops reading (``hold_full``) until the
        changes are answered -- TCP pushes back, as for the log's backlog."""
        order = self._order
        held = order.held
        if held is None:
            if not order.changing or type(item) is m.BasicPublish or not self._must_wait(handler, item):
                return False
            held = order.held = deque()
        elif type(item) is m.BasicPublish:
            return False  # its content is assembled now; the complete publish is held (_submit_publish)
        held.append((handler, item))
        order.held_bytes += _held_size(handler, item)
        if not order.held_full and order.held_bytes > self.conn.write_high:
            order.held_full = True
            self.conn.hold_full(self.number)
        return True

    def _changed(self, change: int) -> None:
        """A topology change of this channel was answered: its reply came from the node's replica of
        the metadata group (with groups, joined with every queue group's echo: node/groups.py
        ReplyJoin), so the node's view includes it; what was held behind it goes on."""
        order = self._order
        order.changing -= 1
        if change == QUEUE_DELETE:
            order.deleting -= 1
        if order.held is not None and self.state == OPEN:
            self._release()
        else:
            self._gated = order.changing > 0 or order.held is not None

    def _release(self) -> None:
        """Run the held input in order until the next item that must still wait (behind a change
        one of the released methods made) or the end."""
        order = self._order
        held = order.held
        assert held is not None
        order.held = None  # while an item runs: it is not held again (it need not wait)
        while held:
            handler, item = held[0]
            if order.changing and self._must_wait(handler, item):
                break
            held.popleft()
            order.held_bytes -= _held_size(handler, item)
            if handler is None:
                self._submit_publish(*item)
            else:
                try:
                    handler(self, item)
                except ChannelException as exc:
                    self.fail(exc.code, exc.text, item.CLASS_ID, item.METHOD_ID)
            if self.state != OPEN:  # closed by the client or by an error: the rest is not run
                self._drop_held(held)
                return
        if held:
            order.held = held
        else:
            order.held_bytes = 0
        self._gated = order.changing > 0 or order.held is not None
        if order.held_full and order.held_bytes <= self.conn.write_high // 2:
            order.held_full = False
            self.conn.hold_released(self.number)

    def _drop_held(self, held: deque) -> None:
        """The channel closed with input held: its methods are read as a closing channel reads
        them (a channel.close crossing ours is answered close-ok), the rest dropped."""
        order = self._order
        order.held_bytes = 0
        self._gated = False
        if order.held_full:
            order.held_full = False
            self.conn.hold_released(self.number)
        for handler, item in held:
            if handler is not None and self.state != CLOSED:
                self.on_method(item)

    @property
    def held_input_bytes(self) -> int:
        """Bytes of the input held behind a topology change (counted for the memory alarm)."""
        return self._order.held_bytes

    # ------------------------------------------------------------------ frames

    def on_method(self, method) -> None:
        if self.state == CLOSING_BY_SERVER:
            if isinstance(method, m.ChannelCloseOk):
                self.conn.forget_channel(self.number)
            elif isinstance(method, m.ChannelClose):
                self.conn.write(encode_method_frame(self.number, m.ChannelCloseOk()))
            return
        if self.state == CLOSING_BY_CLIENT:
            return
        if self._publish is not None:
            raise ConnectionException(
                505, f"UNEXPECTED_FRAME - expected content header for class 60, got '{method.NAME}'",
                method.CLASS_ID, method.METHOD_ID,
            )
        handler = _HANDLERS.get(type(method))
        if handler is None:
            if method.CLASS_ID == 10:
                raise ConnectionException(503, f"COMMAND_INVALID - '{method.NAME}' on channel {self.number}",
                                          method.CLASS_ID, method.METHOD_ID)
            raise ConnectionException(
                540, f"NOT_IMPLEMENTED - '{method.NAME}' is not accepted from clients",
                method.CLASS_ID, method.METHOD_ID,
            )
        if self.state == OPENING and not isinstance(method, m.ChannelOpen):
            raise ConnectionException(504, "CHANNEL_ERROR - channel not yet open",
                                      method.CLASS_ID, method.METHOD_ID)
        if self._gated and self._hold(handler, method):
            return
        try:
            handler(self, method)
        except ChannelException as exc:
            self.fail(exc.code, exc.text, method.CLASS_ID, method.METHOD_ID)

    def on_header(self, payload: bytes) -> None:
        if self.state != OPEN:
            return
        if self._publish is None:
            raise ConnectionException(505, "UNEXPECTED_FRAME - content header with no content method")
        class_id, body_size, props = decode_content_header(payload)
        if class_id != BASIC_CLASS_ID:
            raise ConnectionException(505, f"UNEXPECTED_FRAME - content header for class {class_id}")
        if self._body_size is not None:
            raise ConnectionException(505, "UNEXPECTED_FRAME - second content header")
        if body_size > self.conn.config.max_message_size:
            self._publish = None
            self.fail(406, f"PRECONDITION_FAILED - message size {body_size} is larger than configured "
                           f"max size {self.conn.config.max_message_size}", 60, 40)
            return
        self._props = props
        self._body_size = body_size
        if body_size == 0:
            self._publish_complete(b"")

    def on_body(self, payload: bytes) -> None:
        if self.state != OPEN:
            return
        if self._publish is None or self._body_size is None:
            raise ConnectionException(505, "UNEXPECTED_FRAME - content body with no content header")
        self._body_parts.append(payload)
        self._body_received += len(payload)
        if self._body_received > self._body_size:
            raise ConnectionException(501, "FRAME_ERROR - content body larger than the header's body size")
        if self._body_received == self._body_size:
            parts = self._body_parts
            self._publish_complete(parts[0] if len(parts) == 1 else b"".join(parts))

    # ------------------------------------------------------------------ channel class

    def _channel_open(self, method: m.ChannelOpen) -> None:
        if self.state != OPENING:
            raise ConnectionException(504, f"CHANNEL_ERROR - second 'channel.open' on channel {self.number}",
                                      method.CLASS_ID, method.METHOD_ID)
        self.state = OPEN
        self._request(self._command(ChannelOpen), method, lambda _: m.ChannelOpenOk())

    def _channel_close(self, method: m.ChannelClose) -> None:
        self.state = CLOSING_BY_CLIENT
        self.flush_confirms()
        self._reset_local_state()

        def closed(_):
            # The log applied every earlier method and publish before this close: their replies,
            # returns and confirms go out now, ahead of close-ok, and nothing after it (CLOSED).  A
            # slot still empty belongs to a method that failed while closing: it has no reply.
            self.conn.forget_channel(self.number)
            for slot in self._replies:
                if slot[0]:
                    self._send_slot(slot)
            self._replies.clear()
            self.flush_confirms()
            self.conn.write(encode_method_frame(self.number, m.ChannelCloseOk()))
            self.state = CLOSED

        self.conn.request(self, self._command(ChannelClose), type(method), closed)

    def _channel_close_ok(self, method) -> None:
        return None  # only meaningful while we are closing (handled in on_method)

    def _channel_flow(self, method: m.ChannelFlow) -> None:
        def flowed(active):
            self._paused = not active
            self._send_held()
            return m.ChannelFlowOk(active=active)

        self._request(self._command(Flow, bool(method.active)), method, flowed)

    def _channel_flow_ok(self, method) -> None:
        return None  # the server never sends channel.flow, so an answer is simply dropped

    # ------------------------------------------------------------------ exchange class

    def _authorize(self, command: Command) -> None:
        """The core's permission rule for ``command`` (node/core/access.py), as a 403 channel error."""
        try:
            self.conn.access.authorize(command)
        except AccessRefused as exc:
            raise ChannelException(403, f"ACCESS_REFUSED - {exc.text}") from None

    def _exchange_declare(self, method: m.ExchangeDeclare) -> None:
        args = to_plain(method.arguments or {})
        command = self._command(ExchangeDeclare, self.conn.vhost, method.exchange, method.type,
                                bool(method.passive), bool(method.durable), bool(method.auto_delete),
                                bool(method.internal), args)
        self._authorize(command)  # before the arguments are looked at, as RabbitMQ does
        alternate = args.get("alternate-exchange")
        if alternate is not None and not isinstance(alternate, str):
            raise ChannelException(406, "PRECONDITION_FAILED - invalid 'alternate-exchange' argument")
        self._request(command, method, lambda _: m.ExchangeDeclareOk(), method.no_wait,
                      NO_CHANGE if method.passive else META_CHANGE)

    def _exchange_delete(self, method: m.ExchangeDelete) -> None:
        command = self._command(ExchangeDelete, self.conn.vhost, method.exchange, bool(method.if_unused))
        self._request(command, method, lambda _: m.ExchangeDeleteOk(), method.no_wait, META_CHANGE)

    def _exchange_bind(self, method: m.ExchangeBind) -> None:
        vhost = self.conn.vhost
        command = self._command(ExchangeBind, vhost, method.destination, method.source,
                                method.routing_key, to_plain(method.arguments or {}))
        self._request(command, method, lambda _: m.ExchangeBindOk(), method.no_wait, META_CHANGE)

    def _exchange_unbind(self, method: m.ExchangeUnbind) -> None:
        vhost = self.conn.vhost
        command = self._command(ExchangeUnbind, vhost, method.destination, method.source,
                                method.routing_key, to_plain(method.arguments or {}))
        self._request(command, method, lambda _: m.ExchangeUnbindOk(), method.no_wait, META_CHANGE)

    # ------------------------------------------------------------------ queue class

    def _queue_name(self, name: str, method) -> str:
        """0-9-1: an empty queue name means the last queue declared on this channel."""
        if name:
            return name
        if not self.last_queue:
            raise ChannelException(404, "NOT_FOUND - no previously declared queue")
        return self.last_queue

    def _queue_declare(self, method: m.QueueDeclare) -> None:
        name = method.queue
        server_named = False
        if not name:
            if method.passive:
                name = self._queue_name(name, method)
            else:
                name = _server_queue_name()
                server_named = True
        command = self._command(QueueDeclare, self.conn.vhost, name, bool(method.passive),
                                bool(method.durable), bool(method.exclusive), bool(method.auto_delete),
                                to_plain(method.arguments or {}), server_named)

        def declared(value):
            queue, message_count, consumer_count = value
            return m.QueueDeclareOk(queue=queue, message_count=message_count, consumer_count=consumer_count)

        # The queue a later method names with "" is this one from now on (reference 1.7.2.3,
        # queue.bind and others: "the last queue declared on the channel"), as if the declare were applied now: a
        # bind or get pipelined behind it names it (a failed declare closes the channel anyway).
        self.last_queue = name
        self._request(command, method, declared, method.no_wait, NO_CHANGE if method.passive else META_CHANGE)

    def _queue_bind(self, method: m.QueueBind) -> None:
        queue = self._queue_name(method.queue, method)
        routing_key = method.routing_key if (method.queue or method.routing_key) else queue
        vhost = self.conn.vhost
        command = self._command(QueueBind, vhost, queue, method.exchange, routing_key,
                                to_plain(method.arguments or {}))
        self._request(command, method, lambda _: m.QueueBindOk(), method.no_wait, META_CHANGE)

    def _queue_unbind(self, method: m.QueueUnbind) -> None:
        queue = self._queue_name(method.queue, method)
        vhost = self.conn.vhost
        command = self._command(QueueUnbind, vhost, queue, method.exchange, method.routing_key,
                                to_plain(method.arguments or {}))
        self._request(command, method, lambda _: m.QueueUnbindOk(), change=META_CHANGE)

    def _queue_purge(self, method: m.QueuePurge) -> None:
        queue = self._queue_name(method.queue, method)
        command = self._command(QueuePurge, self.conn.vhost, queue)
        self._request(command, method, lambda count: m.QueuePurgeOk(message_count=count), method.no_wait)

    def _queue_delete(self, method: m.QueueDelete) -> None:
        queue = self._queue_name(method.queue, method)
        command = self._command(QueueDelete, self.conn.vhost, queue, bool(method.if_unused),
                                bool(method.if_empty))
        self._request(command, method, lambda count: m.QueueDeleteOk(message_count=count), method.no_wait,
                      QUEUE_DELETE)

    # ------------------------------------------------------------------ basic class

    def _basic_qos(self, method: m.BasicQos) -> None:
        if method.prefetch_size:
            raise ConnectionException(540, f"NOT_IMPLEMENTED - prefetch_size!=0 ({method.prefetch_size})",
                                      method.CLASS_ID, method.METHOD_ID)
        if method.global_:
            self._window.channel_limit = method.prefetch_count
        else:
            self._window.next_consumer_limit = method.prefetch_count
        window = assigned_window(method.prefetch_count, self.conn.config.prefetch_readahead)
        command = self._command(Qos, window, bool(method.global_))
        self._request(command, method, lambda _: m.BasicQosOk())

    def _basic_consume(self, method: m.BasicConsume) -> None:
        queue = self._queue_name(method.queue, method)
        if method.consumer_tag and method.consumer_tag in self._consumers:
            raise ConnectionException(530, f"NOT_ALLOWED - attempt to reuse consumer tag "
                                           f"'{method.consumer_tag}'", method.CLASS_ID, method.METHOD_ID)
        no_ack = bool(method.no_ack)
        arguments = to_plain(method.arguments or {})
        arguments.pop(AUTOACK_CREDIT, None)  # the node's own (autoack.py), never a client's
        credited = no_ack and self.conn.config.autoack_credit > 0  # 0: off (rolling upgrades, autoack.py)
        if credited:
            arguments[AUTOACK_CREDIT] = MIN_SLICE
        command = self._command(Consume, self.conn.vhost, queue, method.consumer_tag, no_ack,
                                bool(method.exclusive), arguments)
        limit = self._window.next_consumer_limit

        def consuming(tag):
            self._consumers[tag] = no_ack
            if credited:
                self._autoack[tag] = AutoAckCredit(self.conn.config.autoack_credit, self.conn.write_high)
            self._window.add_consumer(tag, limit)
            return m.BasicConsumeOk(consumer_tag=tag)

        self._request(command, method, consuming, method.no_wait)

    def _basic_cancel(self, method: m.BasicCancel) -> None:
        command = self._command(Cancel, method.consumer_tag)

        def cancelled(tag):
            self._consumers.pop(tag, None)
            self._autoack.pop(tag, None)
            self._return_held(tag)
            return m.BasicCancelOk(consumer_tag=tag)

        self._request(command, method, cancelled, method.no_wait)

    def _basic_publish(self, method: m.BasicPublish) -> None:
        if method.immediate:
            raise ConnectionException(540, "NOT_IMPLEMENTED - immediate=true", method.CLASS_ID, method.METHOD_ID)
        self._publish = method
        self._body_size = None
        self._body_parts = []
        self._body_received = 0
        self.conn.is_publisher = True

    def publish_whole(self, publish: WholePublish) -> bool:
        """A basic.publish whose header and single body frame arrived in the same read, parsed by
        the frame reader (``FrameReader(whole_publishes=True)``).

        The common case of a publisher's traffic, taken in one step instead of three frame
        dispatches, a method object and the content assembly (the node a publisher is connected to
        spent ~12-17 µs per message in the front end; see bench/ingress.py).  Returns False,
        *without side effects*, when this channel cannot take it so (not open, content already under
        way, immediate, an oversize body): the caller then passes the three frames through the
        general path, which answers with the spec's reply code.
        """
        if (self.state != OPEN or self._publish is not None or publish.bits & 2
                or len(publish.body) > self.conn.config.max_message_size):
            return False
        self.conn.is_publisher = True
        self._submit_publish(publish.exchange, publish.routing_key, bool(publish.bits & 1), publish.properties,
                             publish.body, None)
        return True

    def _publish_complete(self, body: bytes) -> None:
        method, props = self._publish, self._props
        self._publish = None
        self._body_parts = []
        self._submit_publish(method.exchange, method.routing_key, method.mandatory, props, body, method)

    def _submit_publish(self, exchange: str, routing_key: str, mandatory: bool, props: bytes, body: bytes,
                        method: m.BasicPublish | None) -> None:
        """Check a complete publish and hand it to the broker (``method`` is rebuilt for a return
        when the fused path had none)."""
        if self._gated and self._hold(None, (exchange, routing_key, mandatory, props, body, method)):
            return  # behind a topology change of this channel (_must_wait)
        conn = self.conn
        vhost = conn.vhost
        try:
            conn.access.require(WRITE, "exchange", exchange)  # the PUBLISH rule, without a command yet
            machine_vhost = conn.broker.machine.vhosts.get(vhost)
            if machine_vhost is None or exchange not in machine_vhost.exchanges:
                raise ChannelException(404, f"NOT_FOUND - no exchange '{exchange}' in vhost '{vhost}'")
            try:
                delivery_mode, priority, expiration = peek_properties(props)
            except AMQPError as exc:
                raise ConnectionException(exc.reply_code, exc.reply_text, 60, 40) from exc
            expiration_ms = None
            if expiration is not None:
                if isinstance(expiration, bytes):
                    expiration = expiration.decode("ascii", "replace")
                if not expiration.isdigit():
                    raise ChannelException(406, f"PRECONDITION_FAILED - invalid expiration '{expiration}'")
                expiration_ms = int(expiration)
        except AccessRefused as exc:
            self.fail(403, f"ACCESS_REFUSED - {exc.text}", 60, 40)
            return
        except ChannelException as exc:
            self.fail(exc.code, exc.text, 60, 40)
            return
        if mandatory and method is None:
            method = m.BasicPublish(exchange=exchange, routing_key=routing_key, mandatory=True)
        # A confirm or a return needs the reply: the token goes into the command as it is built
        # (commands are immutable), a transaction's operations answer through its commit.
        token = conn.issue_token() if (self.confirm_mode or mandatory) and not self.tx_mode else None
        # Publish(...) without its Python-level __new__ (0.07 instead of 0.19 µs, once per message):
        # every field, in Publish's order (checked by tests/unit/store/test_commands.py).
        command = _new_tuple(Publish, (conn.conn_id, token, self.number, vhost, exchange, routing_key, mandatory,
                                       props, body, delivery_mode == 2, priority, expiration_ms, AMQP091,
                                       Op.PUBLISH))
        if self.tx_mode:
            self._tx_ops.append(command)
            if mandatory:
                self._tx_returns.append((method, props, body))
            else:
                self._tx_returns.append(None)
            return
        size = 32 + len(props) + len(body)
        conn.counts[0] += 1
        if self.confirm_mode:
            self._publish_seq += 1
            seq = self._publish_seq
            self._unconfirmed += 1
            deferrable = self._unconfirmed > AMPLE_UNCONFIRMED
            if mandatory:
                slot = self._slot()
                conn.request(self, command, m.BasicPublish,
                             lambda outcome: self._published(outcome, seq, method, props, body, slot),
                             deferrable, size)
            else:
                conn.request_publish(self, command, seq, deferrable, size)
        elif mandatory:
            slot = self._slot()
            conn.request(self, command, m.BasicPublish,
                         lambda outcome: self._published(outcome, 0, method, props, body, slot), size=size)
        else:
            conn.broker.submit(command, False, size)

    def settle_publish(self, seq: int, result: tuple) -> None:
        """The outcome of a confirm-mode publish that asked for no return (Connection.request_publish)."""
        if result.status != OK:
            self.fail_from_broker(result.code, result.text, m.BasicPublish)
            return
        self._unconfirmed -= 1
        self._confirms.append((seq, result.value != REJECTED))
        self.conn.confirm_dirty[self.number] = self

    def _published(self, outcome: int, seq: int, mandatory_method, props: bytes, body: bytes,
                   slot: list) -> None:
        """A mandatory publish's outcome: its return (if unroutable) in its reply slot, then its
        confirm (RabbitMQ sends basic.return before the basic.ack of the same message)."""
        if seq:
            self._unconfirmed -= 1
        # (NOT_HERE: queue groups, a lone group routed it nowhere of its own -- the view it was
        # routed with was older than the queue -- so it was stored nowhere: unroutable)
        self._fill(slot, self._return_frames(mandatory_method, props, body)
                   if outcome in (UNROUTABLE, NOT_HERE) else None,
                   (seq, outcome != REJECTED) if seq else None)

    def _send_return(self, method, props: bytes, body: bytes) -> None:
        self.conn.write(self._return_frames(method, props, body))

    def _return_frames(self, method, props: bytes, body: bytes) -> bytes:
        return encode_content(
            self.number,
            m.BasicReturn(reply_code=312, reply_text="NO_ROUTE", exchange=method.exchange,
                          routing_key=method.routing_key),
            props, body, self.conn.frame_max)

    @property
    def consumer_count(self) -> int:
        """The consumers this channel started and has not cancelled (the front end's count: with
        queue groups a consumer lives in its queue's group, not in the node's view; issue 34)."""
        return len(self._consumers)

    def flush_confirms(self) -> None:
        """Send the confirms gathered from one output batch.

        Outcomes arrive in publish order (the log's order), so a run of acks is one basic.ack with
        multiple=true for its last sequence number; nacks go one by one.  With queue groups (issue
        34) a publish's outcome comes when its groups applied it, so one channel's outcomes may
        arrive out of order (a publish to a busy group after a later one to another group): an
        outcome that is not the next in order waits until the earlier ones came.  A multiple ack
        then never covers a publish no group has committed yet, and the client sees its confirms in
        order, as with one group.  (RabbitMQ allows acks out of order; holding them costs a later
        publish no more than the multiple ack would have.)
        """
        confirms = self._confirms
        if self._confirms_held:
            self._flush_held_confirms()
            return
        write, number = self.conn.write, self.number
        through = self._answered_through
        run_start = None
        n = len(confirms)
        for i, (seq, acked) in enumerate(confirms):
            if seq != through + 1:  # out of order (queue groups): the rest waits for what is missing
                if run_start is not None:
                    write(encode_method_frame(number, m.BasicAck(delivery_tag=through, multiple=through > run_start)))
                self._answered_through = through
                del confirms[:i]
                self._flush_held_confirms()
                return
            through = seq
            if acked:
                if run_start is None:
                    run_start = seq
                if i + 1 < n and confirms[i + 1][1]:
                    continue
                write(encode_method_frame(number, m.BasicAck(delivery_tag=seq, multiple=seq > run_start)))
                run_start = None
            else:
                write(encode_method_frame(number, m.BasicNack(delivery_tag=seq, multiple=False, requeue=False)))
        self._answered_through = through
        confirms.clear()

    def _flush_held_confirms(self) -> None:
        """flush_confirms once an outcome came out of order: the outcomes not next in order are
        held, and sent (a run of acks as one multiple ack) once those before them came."""
        confirms = self._confirms
        held = self._confirms_held
        through = self._answered_through
        ordered = []
        for seq, acked in confirms:
            if seq != through + 1:  # an earlier publish's outcome is still to come
                held[seq] = acked
                continue
            ordered.append((seq, acked))
            through = seq
            while held and through + 1 in held:
                through += 1
                ordered.append((through, held.pop(through)))
        self._answered_through = through
        confirms.clear()
        write, number = self.conn.write, self.number
        run_start = None
        for i, (seq, acked) in enumerate(ordered):
            if acked:
                if run_start is None:
                    run_start = seq
                if i + 1 < len(ordered) and ordered[i + 1][1]:
                    continue
                write(encode_method_frame(number, m.BasicAck(delivery_tag=seq, multiple=seq > run_start)))
                run_start = None
            else:
                write(encode_method_frame(number, m.BasicNack(delivery_tag=seq, multiple=False, requeue=False)))

    def _basic_get(self, method: m.BasicGet) -> None:
        queue = self._queue_name(method.queue, method)
        no_ack = bool(method.no_ack)
        command = self._command(Get, self.conn.vhost, queue, no_ack)
        self._authorize(command)
        slot = self._slot()

        def got(value):
            if value is None:
                self._fill(slot, encode_method_frame(self.number, m.BasicGetEmpty()))
                return
            qid, seq, redelivered, message, remaining, body = value
            self.conn.counts[1] += 1
            tag = self._track(qid, seq, no_ack)
            self._fill(slot, encode_content(
                self.number,
                m.BasicGetOk(delivery_tag=tag, redelivered=redelivered, exchange=message.exchange,
                             routing_key=message.routing_key, message_count=remaining),
                properties_091(message), body, self.conn.frame_max))

        self.conn.request(self, command, type(method), got)

    def _track(self, qid: int, seq: int, no_ack: bool) -> int:
        self._next_delivery_tag += 1
        tag = self._next_delivery_tag
        if not no_ack:
            self._unacked[tag] = (qid, seq)
        return tag

    def deliver(self, consumer_tag: str, delivery: tuple,
                following: Callable[[], Iterable[int]] | None = None) -> None:
        """A delivery the state machine assigned: send it, or hold it until the client's window has
        room (``following``: see ``_send_delivery``)."""
        if self.state != OPEN:
            return
        no_ack = self._consumers.get(consumer_tag, False)
        window = self._window
        if not no_ack and (self._paused or window.holds(consumer_tag) or not window.has_room(consumer_tag)):
            window.hold(consumer_tag, delivery)
            return
        self._send_delivery(consumer_tag, delivery, no_ack, following)

    # Read by the connection's write back-pressure (node/writeflow.py).

    def consumer_no_ack(self, consumer_tag: str) -> bool | None:
        """Whether the consumer is auto-ack; None when the channel has no such consumer (any more)."""
        return self._consumers.get(consumer_tag)

    @property
    def assignment_bounded(self) -> bool:
        """What the state machine assigns to this channel is bounded by credit (manual acks under a
        basic.qos limit): parking it needs no stop through the log."""
        return not any(self._consumers.values()) and self._window.bounded()

    @property
    def client_flow_active(self) -> bool:
        """The client has not paused this channel with channel.flow active=false."""
        return not self._paused

    @property
    def assembling_bytes(self) -> int:
        """Body bytes of a publish still being received, and bodies of deliveries held beyond the
        client's window (a queue group's carried ones: node/group_bodies.py; none with one group)."""
        return (self._body_received if self._publish is not None else 0) + self._window.body_bytes

    def return_unsent(self, deliveries: list[tuple]) -> None:
        """Assignments never sent (their consumer went while they were parked): back to their
        queues as not delivered. Unknown ones (auto-ack, already gone) are ignored by apply."""
        refs = [[delivery[0], delivery[1]] for delivery in deliveries]
        self.conn.broker.submit(self._command(Nack, refs, True, True))

    def _send_held(self) -> None:
        if self._paused or self.state != OPEN:
            return
        releasable = self._window.releasable()
        at = 0

        def following() -> list[int]:  # the next ones, read with one that missed the cache
            return [d[3].id for _, d in releasable[at + 1:at + READ_AHEAD] if len(d) == 4]

        for at, (consumer_tag, delivery) in enumerate(releasable):  # noqa: B007 (read by following)
            self._send_delivery(consumer_tag, delivery, False, following)

    def _return_held(self, consumer_tag: str) -> None:
        """A cancelled consumer's held deliveries go back to their queues, as never delivered."""
        held = self._window.remove_consumer(consumer_tag)
        if held:
            self.return_unsent(held)

    def _send_delivery(self, consumer_tag: str, delivery: tuple, no_ack: bool,
                       following: Callable[[], Iterable[int]] | None = None) -> None:
        """Write one delivery.  A manual-ack delivery carries no body (store/disk/bodies.fill_bodies): it
        is read now, with ``following`` (the ids sent next) when it is only on disk."""
        if len(delivery) == 5:
            qid, seq, redelivered, message, body = delivery
        else:
            qid, seq, redelivered, message = delivery
            body = self.conn.broker.bodies.for_send(message.id, following, qid)
            if body is None:
                return  # its message is gone (fill_bodies): nothing to send
        self._next_delivery_tag += 1
        tag = self._next_delivery_tag
        if not no_ack:
            self._unacked[tag] = (qid, seq)
            self._window.sent(tag, consumer_tag)
        self.conn.write(encode_delivery(self.number, consumer_tag, tag, redelivered, message.exchange,
                                        message.routing_key, properties_091(message), body,
                                        self.conn.frame_max))
        if no_ack:
            credit = self._autoack.get(consumer_tag)
            if credit is not None:
                more = credit.wrote(message.size)
                if more:  # the core may assign this many more (autoack.py)
                    self.conn.broker.submit(SessionWindowCredit(self.conn.conn_id, None, self.number,
                                                                consumer_tag, more, 0))

    def server_cancel(self, consumer_tag: str) -> None:
        """The queue went away: basic.cancel to clients that announced consumer_cancel_notify."""
        if self.state != OPEN or self._consumers.pop(consumer_tag, None) is None:
            return
        self._autoack.pop(consumer_tag, None)
        self._window.remove_consumer(consumer_tag)  # the queue is gone, and its messages with it
        if self.conn.client_capabilities.get("consumer_cancel_notify"):
            self.conn.write(encode_method_frame(self.number, m.BasicCancel(consumer_tag=consumer_tag,
                                                                          no_wait=True)))

    def _take_tags(self, delivery_tag: int, multiple: bool) -> list[list[int]]:
        unacked = self._unacked
        if multiple:
            tags = [t for t in unacked if t <= delivery_tag] if delivery_tag else list(unacked)
        else:
            if delivery_tag not in unacked:
                raise ChannelException(406, f"PRECONDITION_FAILED - unknown delivery tag {delivery_tag}")
            tags = [delivery_tag]
        refs = []
        for tag in tags:
            ref = unacked.pop(tag)
            if self.tx_mode:
                self._tx_acked[tag] = ref
            refs.append(list(ref))
        if not self.tx_mode:  # in a transaction they stay in the client's window until commit
            self._window.settled(tags)
        return refs

    def _basic_ack(self, method: m.BasicAck) -> None:
        refs = self._take_tags(method.delivery_tag, bool(method.multiple))
        if refs:
            # With read-ahead still held here, the client has work: this ack only returns credit
            # for later assignments, so it may wait a moment to share a batch (raft/cluster.py).
            self._settle(self._command(Ack, refs), deferrable=self._window.ample())
        self._send_held()

    def _basic_nack(self, method: m.BasicNack) -> None:
        refs = self._take_tags(method.delivery_tag, bool(method.multiple))
        if refs:
            self._settle(self._command(Nack, refs, bool(method.requeue)))
        self._send_held()

    def _basic_reject(self, method: m.BasicReject) -> None:
        refs = self._take_tags(method.delivery_tag, False)
        self._settle(self._command(Nack, refs, bool(method.requeue)))
        self._send_held()

    def _settle(self, command: Ack | Nack, deferrable: bool = False) -> None:
        if self.tx_mode:
            self._tx_ops.append(command)
        else:
            self.conn.broker.submit(command, deferrable)

    def _basic_recover(self, method) -> None:
        self._unacked.clear()
        self._window.forget()  # the state machine requeues held deliveries too: they are unacked there
        command = self._command(Recover, bool(method.requeue))
        if isinstance(method, m.BasicRecover):
            self._request(command, method, lambda _: m.BasicRecoverOk())
        else:
            self.conn.broker.submit(command)

    # ------------------------------------------------------------------ tx and confirm classes

    def _tx_select(self, method: m.TxSelect) -> None:
        if self.confirm_mode:
            raise ChannelException(406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")
        self.tx_mode = True
        self._reply_local(m.TxSelectOk())

    def _tx_commit(self, method: m.TxCommit) -> None:
        if not self.tx_mode:
            raise ChannelException(406, "PRECONDITION_FAILED - channel is not transactional")
        operations, returns = self._tx_ops, self._tx_returns
        self._tx_ops, self._tx_returns = [], []
        self._window.settled(list(self._tx_acked))
        self._tx_acked.clear()
        self._send_held()
        command = self._command(TxCommit, operations)

        def committed(outcomes):
            for outcome, returned in zip(outcomes, returns, strict=False):
                if outcome in (UNROUTABLE, NOT_HERE) and returned is not None:
                    self._send_return(*returned)
            return m.TxCommitOk()

        self._request(command, method, committed)

    def _tx_rollback(self, method: m.TxRollback) -> None:
        if not self.tx_mode:
            raise ChannelException(406, "PRECONDITION_FAILED - channel is not transactional")
        self._tx_ops, self._tx_returns = [], []
        # Acks inside the rolled-back transaction never happened: those deliveries stay unacked.
        if self._tx_acked:
            self._unacked.update(self._tx_acked)
            self._unacked = dict(sorted(self._unacked.items()))
            self._tx_acked.clear()
        self._reply_local(m.TxRollbackOk())

    def _confirm_select(self, method: m.ConfirmSelect) -> None:
        if self.tx_mode:
            raise ChannelException(406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")
        self.confirm_mode = True
        if not method.no_wait:
            self._reply_local(m.ConfirmSelectOk())


_HANDLERS = {
    m.ChannelOpen: Channel._channel_open,
    m.ChannelClose: Channel._channel_close,
    m.ChannelCloseOk: Channel._channel_close_ok,
    m.ChannelFlow: Channel._channel_flow,
    m.ChannelFlowOk: Channel._channel_flow_ok,
    m.ExchangeDeclare: Channel._exchange_declare,
    m.ExchangeDelete: Channel._exchange_delete,
    m.ExchangeBind: Channel._exchange_bind,
    m.ExchangeUnbind: Channel._exchange_unbind,
    m.QueueDeclare: Channel._queue_declare,
    m.QueueBind: Channel._queue_bind,
    m.QueueUnbind: Channel._queue_unbind,
    m.QueuePurge: Channel._queue_purge,
    m.QueueDelete: Channel._queue_delete,
    m.BasicQos: Channel._basic_qos,
    m.BasicConsume: Channel._basic_consume,
    m.BasicCancel: Channel._basic_cancel,
    m.BasicPublish: Channel._basic_publish,
    m.BasicGet: Channel._basic_get,
    m.BasicAck: Channel._basic_ack,
    m.BasicNack: Channel._basic_nack,
    m.BasicReject: Channel._basic_reject,
    m.BasicRecover: Channel._basic_recover,
    m.BasicRecoverAsync: Channel._basic_recover,
    m.TxSelect: Channel._tx_select,
    m.TxCommit: Channel._tx_commit,
    m.TxRollback: Channel._tx_rollback,
    m.ConfirmSelect: Channel._confirm_select,
}


def properties_091(message: Message) -> bytes:
    """The message's properties as 0-9-1 bytes: as published when a 0-9-1 client published it (no
    decoding on this path), converted through the neutral form otherwise (store/core/message.py)."""
    if message.format == AMQP091:
        return message.properties
    return properties_in(message, AMQP091, EMPTY_PROPERTIES)


EMPTY_PROPERTIES = b"\x00\x00"
