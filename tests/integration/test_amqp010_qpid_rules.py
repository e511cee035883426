"""AMQP 0-10 behaviours that clients we did not write depend on (issue 23), on raw frames.

Each test cites the rule of shared/specs/amqp-0-10.txt it checks (by line), and is what Apache
Qpid's clients need from a broker: the first four are the behaviours that made qpid.messaging hang
(tests/interop drives the real client); the others are the spec's codes for refusals.
"""

from __future__ import annotations

import time

import pytest

from raftmq.protocol.amqp010 import codec as c
from raftmq.protocol.amqp010.frames import encode_assembly
from tests.integration.test_amqp010_conformance import Raw, port  # noqa: F401  (port is a fixture)


def _name(prefix: str) -> str:
    return f"{prefix}-{time.monotonic_ns()}"


def _raw_attached(port: int, prefix: str) -> Raw:  # noqa: F811
    raw = Raw(port)
    raw.handshake()
    raw.send(c.SessionAttach(name=_name(prefix).encode()), 1)
    raw.expect(c.SessionAttached)
    raw.send(c.SessionCommandPoint(command_id=0, command_offset=0), 1)
    return raw


def _receive_on(raw: Raw, timeout: float = 5.0) -> list:
    """Everything the broker sends until `timeout` passes quietly (the order matters to the tests)."""
    got = []
    while True:
        try:
            item = raw.receive(timeout)
        except AssertionError:
            return got
        if item is None:
            return got
        got.append(item[1])
        timeout = 0.5


def test_command_point_precedes_the_first_command_of_an_attachment(port):  # noqa: F811
    """session.command-point (L4625ff): "This control MUST be used at least once prior to sending any
    command data on newly attached transports" -- the server's own commands (here the
    execution.result of a query, command id 0) come after a command-point."""
    raw = _raw_attached(port, "cp-first")
    raw.send(c.QueueQuery(queue="amq.none", sync=True), 1)
    got = _receive_on(raw, 5.0)
    commands = [m for m in got if isinstance(m, c.Command)]
    assert commands, got
    first = got.index(commands[0])
    points = [m for m in got[:first] if isinstance(m, c.SessionCommandPoint)]
    assert points and points[-1].command_id == 0 and points[-1].command_offset == 0
    raw.close()


def test_command_point_sent_right_after_attach_is_honoured(port):  # noqa: F811
    """session.attach (L4465ff) and session.command-point (L4625ff): a client may send command-point
    and commands straight after attach without waiting for attached; they are not refused with
    detached(not-attached) nor dropped: the commands are executed in the numbering set."""
    raw = Raw(port)
    raw.handshake()
    queue = _name("early")
    burst = (c.SessionAttach(name=_name("early").encode()), c.SessionCommandPoint(command_id=7, command_offset=0),
             c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), c.QueueQuery(queue=queue, sync=True))
    raw.send_bytes(b"".join(encode_assembly(1, *c.segments_of(m)) for m in burst))  # one read: attach pending
    got = _receive_on(raw, 5.0)
    assert isinstance(got[0], c.SessionAttached), got
    assert not [m for m in got if isinstance(m, c.SessionDetached)], got
    result = next(m for m in got if isinstance(m, c.ExecutionResult))
    assert result.command_id == 8 and result.value.queue == queue
    completed = [m for m in got if isinstance(m, c.SessionCompleted)]
    assert (7, 8) in [tuple(r) for r in completed[-1].commands]
    raw.close()


def test_omitted_accept_and_acquire_modes_take_the_domains_first_value(port):  # noqa: F811
    """message.transfer (L5676ff) and message.subscribe (L5948ff) mark accept-mode and acquire-mode
    required, and 4.x says an absent required field means the struct "SHOULD be considered
    malformed" -- a SHOULD: Qpid brokers and clients read an absent one as the domain's first value,
    explicit (0) and pre-acquired (0) (message.accept-mode L5509ff), and so do we."""
    raw = _raw_attached(port, "modes")
    queue = _name("modes")
    raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), 1)
    raw.send(c.MessageTransfer(destination="", headers=[c.DeliveryProperties(routing_key=queue)],
                               body=b"no modes"), 1)
    raw.send(c.MessageSubscribe(queue=queue, destination="d"), 1)
    raw.send(c.MessageFlow(destination="d", unit=0, value=10), 1)
    raw.send(c.MessageFlow(destination="d", unit=1, value=0xFFFFFFFF), 1)
    transfer = raw.expect(c.MessageTransfer)
    assert transfer.body == b"no modes"
    assert (transfer.accept_mode, transfer.acquire_mode) == (0, 0)  # explicit, pre-acquired
    raw.send(c.ExchangeBind(queue=queue, exchange="amq.topic"), 1)  # binding-key left out: ""
    raw.send(c.ExchangeBound(exchange="amq.topic", queue=queue, binding_key="", sync=True), 1)
    bound = raw.expect(c.ExecutionResult).value
    assert not (bound.queue_not_matched or bound.key_not_matched or bound.exchange_not_found)
    raw.send(c.MessageAccept(transfers=[(0, 0)], sync=True), 1)
    got = _receive_on(raw, 2.0)
    assert not [m for m in got if isinstance(m, c.ExecutionException)], got
    raw.close()


def test_query_of_a_missing_queue_answers_with_no_name(port):  # noqa: F811
    """queue.query (L7912ff) has no rule for a queue that does not exist; Qpid brokers answer with
    a result whose fields are all absent, and clients read the absent name as "no such queue"
    (qpid.messaging then declares it). Echoing the asked name made them believe it existed."""
    raw = _raw_attached(port, "qq")
    raw.send(c.QueueQuery(queue=_name("nowhere"), sync=True), 1)
    result = raw.expect(c.ExecutionResult).value
    assert isinstance(result, c.QueueQueryResult)
    assert result.queue is None and result.message_count is None and result.subscriber_count is None
    raw.close()


def test_the_channel_is_free_again_after_an_execution_exception(port):  # noqa: F811
    """3.4.1.3: an execution exception is followed by session.detach; once the client answered
    session.detached (L4552ff) the channel carries no session, so it gets no detached(not-attached)
    back and a new attach on the same channel is answered with attached."""
    raw = _raw_attached(port, "exc")
    raw.send(c.QueueDelete(), 1)  # queue is required and has no default: 531
    assert raw.expect(c.ExecutionException).error_code == 531
    detach = raw.expect(c.SessionDetach)
    raw.send(c.SessionDetached(name=detach.name, code=0), 1)
    raw.send(c.SessionAttach(name=_name("again").encode()), 1)
    got = _receive_on(raw, 5.0)
    assert got and isinstance(got[0], c.SessionAttached), got
    raw.close()


# ---------------------------------------------------------------------- the spec's codes for refusals


def _exception_for(port: int, *commands) -> c.ExecutionException:  # noqa: F811
    """Send ``commands`` on a fresh session; the execution.exception that follows."""
    raw = _raw_attached(port, "refusal")
    for command in commands:
        raw.send(command, 1)
    exc = raw.expect(c.ExecutionException)
    raw.close()
    return exc


def test_declaring_an_amq_exchange_is_not_allowed(port):  # noqa: F811
    """exchange.declare exception reserved-names (L7203ff): 'Exchange names starting with "amq." are
    reserved ... The client MUST NOT attempt to create an exchange starting with "amq."' -- not-allowed
    (530)."""
    exc = _exception_for(port, c.ExchangeDeclare(exchange=f"amq.{_name('x')}", type="direct"))
    assert exc.error_code == 530


def test_declaring_a_qpid_exchange_is_not_allowed_but_similar_names_are(port):  # noqa: F811
    """Qpid's convention beside reserved-names (L7203ff): "qpid." exchange names are its brokers' own,
    not-allowed (530) as "amq." ones; "qpid", "pid." or "abc.qpid." are ordinary names (Qpid's
    DeclareMethodExchangeFieldReservedRuleTests.test_qpid)."""
    exc = _exception_for(port, c.ExchangeDeclare(exchange=f"qpid.{_name('x')}", type="direct"))
    assert exc.error_code == 530
    raw = _raw_attached(port, "qpid-names")
    names = [f"{prefix}{_name('ok')}" for prefix in ("qpid", "pid.", "abc.qpid.")]
    for name in names:
        raw.send(c.ExchangeDeclare(exchange=name, type="fanout", auto_delete=True), 1)
    for name in names:
        raw.send(c.ExchangeQuery(name=name), 1)
        assert raw.expect(c.ExecutionResult).value.type == "fanout"  # declared, no exception before
    for name in names:
        raw.send(c.ExchangeDelete(exchange=name), 1)
    raw.close()


def test_redeclaring_an_exchange_with_another_type_is_not_allowed(port):  # noqa: F811
    """exchange.declare exception typed (L7216ff): "Exchanges cannot be redeclared with different
    types" -- not-allowed (530)."""
    name = _name("typed")
    exc = _exception_for(port, c.ExchangeDeclare(exchange=name, type="direct", auto_delete=True),
                         c.ExchangeDeclare(exchange=name, type="fanout", auto_delete=True))
    assert exc.error_code == 530 and exc.command_id == 1


def test_an_unknown_exchange_type_is_not_found(port):  # noqa: F811
    """exchange.declare exception exchange-type-not-found (L7229ff): "If the client attempts to create
    an exchange which the server does not recognize, an exception MUST be sent" -- not-found (404)."""
    exc = _exception_for(port, c.ExchangeDeclare(exchange=_name("t"), type="x-no-such-type"))
    assert exc.error_code == 404


def test_the_default_exchange_cannot_be_deleted_bound_or_unbound(port):  # noqa: F811
    """exchange.delete (L7282ff), exchange.bind (L7448ff), exchange.unbind (L7498ff) exception
    exchange-name-required: "The name of the exchange MUST NOT be a blank or empty string" --
    invalid-argument (542)."""
    queue = _name("dflt")
    declare = c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True)
    for command in (c.ExchangeDelete(exchange=""),
                    c.ExchangeBind(queue=queue, exchange="", binding_key=queue),
                    c.ExchangeUnbind(queue=queue, exchange="", binding_key=queue)):
        exc = _exception_for(port, declare, command)
        assert exc.error_code == 542, command


def test_exclusive_subscribe_to_a_busy_queue_is_resource_locked(port):  # noqa: F811
    """message.subscribe exception in-use (L6046ff): "The server MUST NOT grant an exclusive
    subscription to a queue that already has subscribers" -- resource-locked (405)."""
    queue = _name("busy")
    exc = _exception_for(port, c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True),
                         c.MessageSubscribe(queue=queue, destination="a", accept_mode=0, acquire_mode=0),
                         c.MessageSubscribe(queue=queue, destination="b", accept_mode=0, acquire_mode=0,
                                            exclusive=True))
    assert exc.error_code == 405 and exc.command_id == 2


def test_exchange_bound_without_a_queue_asks_about_the_exchange(port):  # noqa: F811
    """exchange.bound (L7509ff): queue "If populated then determine whether the given queue is bound"
    -- left out, the answer is about the exchange's bindings with that key, no queue-not-found."""
    raw = _raw_attached(port, "bound")
    queue = _name("bound")
    raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), 1)
    raw.send(c.ExchangeBind(queue=queue, exchange="amq.direct", binding_key=queue), 1)
    raw.send(c.ExchangeBound(exchange="amq.direct", binding_key=queue, sync=True), 1)
    bound = raw.expect(c.ExecutionResult).value
    assert not (bound.exchange_not_found or bound.queue_not_found or bound.key_not_matched)
    raw.send(c.ExchangeBound(exchange="amq.direct", binding_key=_name("nokey"), sync=True), 1)
    unbound = raw.expect(c.ExecutionResult).value
    assert unbound.key_not_matched and not unbound.queue_not_found
    raw.close()


def test_window_is_the_default_flow_mode_and_completion_restores_credit(port):  # noqa: F811
    """message.set-flow-mode rule default-flow-mode (L6137ff): "Prior to receiving an explicit
    set-flow-mode command, a peer MUST consider the flow-mode to be window"; and (L6097ff) "Completion
    of the transfer command with session.completed is the only way credit is implicitly updated;
    message.accept ... have no effect": an accept gives nothing back, session.completed does."""
    raw = _raw_attached(port, "window")
    queue = _name("window")
    raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), 1)
    for i in range(3):
        raw.send(c.MessageTransfer(destination="", accept_mode=1, acquire_mode=0,
                                   headers=[c.DeliveryProperties(routing_key=queue)], body=b"w%d" % i), 1)
    raw.send(c.MessageSubscribe(queue=queue, destination="w", accept_mode=0, acquire_mode=0), 1)
    raw.send(c.MessageFlow(destination="w", unit=0, value=1), 1)
    raw.send(c.MessageFlow(destination="w", unit=1, value=0xFFFFFFFF), 1)
    first = raw.expect(c.MessageTransfer)
    raw.send(c.SessionCommandPoint(command_id=6, command_offset=0), 1)  # ids 0-5 were sent above
    raw.send(c.MessageAccept(transfers=[(0, 0)], sync=True), 1)
    after_accept = [m for m in _receive_on(raw, 1.0) if isinstance(m, c.MessageTransfer)]
    assert first.body == b"w0" and after_accept == []
    raw.send(c.SessionCompleted(commands=[(0, 0)]), 1)  # the transfer was command 0 of the server's
    second = raw.expect(c.MessageTransfer)
    assert second.body == b"w1"
    raw.close()


def test_cancelling_an_unknown_subscription_is_not_found(port):  # noqa: F811
    """message.cancel exception subscription-not-found (L6082ff): not-found (404)."""
    exc = _exception_for(port, c.MessageCancel(destination=_name("nobody")))
    assert exc.error_code == 404


def test_deleting_a_missing_queue_is_not_found(port):  # noqa: F811
    """queue.delete exception queue-exists (L7832ff): "The queue must exist. If the client attempts to
    delete a non-existing queue the server MUST raise an exception" -- not-found (404)."""
    exc = _exception_for(port, c.QueueDelete(queue=_name("missing")))
    assert exc.error_code == 404


def test_unknown_queue_arguments_are_not_implemented(port):  # noqa: F811
    """queue.declare exception unknown-argument (L7791ff): "If the arguments field contains arguments
    which are not understood by the server, it MUST raise an exception" -- not-implemented (540)."""
    exc = _exception_for(port, c.QueueDeclare(queue=_name("args"), exclusive=True, auto_delete=True,
                                              arguments={"qpid.last_value_queue_key": "k"}))
    assert exc.error_code == 540


def test_changing_an_exchanges_alternate_is_not_allowed(port):  # noqa: F811
    """exchange.declare exception pre-existing-exchange (L7235ff): "If the alternate-exchange is not
    empty and if the exchange already exists with a different alternate-exchange, then the
    declaration MUST result in an exception" -- not-allowed (530)."""
    name = _name("alt")
    exc = _exception_for(port,
                         c.ExchangeDeclare(exchange=name, type="fanout", alternate_exchange="amq.fanout",
                                           auto_delete=True),
                         c.ExchangeDeclare(exchange=name, type="fanout", alternate_exchange="amq.topic",
                                           auto_delete=True))
    assert exc.error_code == 530 and exc.command_id == 1


def test_an_exchange_used_as_alternate_cannot_be_deleted(port):  # noqa: F811
    """exchange.delete exception used-as-alternate (L7288ff): "An exchange MUST NOT be deleted if it is
    in use as an alternate-exchange by a queue or by another exchange" -- not-allowed (530)."""
    alternate, user = _name("alternate"), _name("user")
    exc = _exception_for(port, c.ExchangeDeclare(exchange=alternate, type="fanout"),
                         c.ExchangeDeclare(exchange=user, type="direct", alternate_exchange=alternate),
                         c.ExchangeDelete(exchange=alternate))
    assert exc.error_code == 530 and exc.command_id == 2
    raw = _raw_attached(port, "cleanup")
    raw.send(c.ExchangeDelete(exchange=user), 1)
    raw.send(c.ExchangeDelete(exchange=alternate, sync=True), 1)
    assert not [m for m in _receive_on(raw, 1.0) if isinstance(m, c.ExecutionException)]
    raw.close()


def test_a_headers_binding_needs_x_match(port):  # noqa: F811
    """Rule headers_exchange_requires_match_arg (L9218ff): "If the arguments field does not contain a
    key "x-match" then an exception of type invalid-argument MUST be raised" (542)."""
    queue = _name("hdr")
    exc = _exception_for(port, c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True),
                         c.ExchangeBind(queue=queue, exchange="amq.match", binding_key="k", arguments={"a": 1}))
    assert exc.error_code == 542


def test_unbinding_a_headers_binding_removes_it(port):  # noqa: F811
    """exchange.unbind (L7458ff) names a binding by queue, exchange and binding-key: a headers
    binding (with its x-match arguments) is removed by it; a key never bound is not-found
    (non-existent-binding-key, L7504ff)."""
    raw = _raw_attached(port, "unbind")
    queue = _name("unbind")
    raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), 1)
    raw.send(c.ExchangeBind(queue=queue, exchange="amq.match", binding_key="k",
                            arguments={"x-match": "all", "a": 1}), 1)
    raw.send(c.ExchangeUnbind(queue=queue, exchange="amq.match", binding_key="k"), 1)
    raw.send(c.ExchangeBound(exchange="amq.match", queue=queue, sync=True), 1)
    bound = raw.expect(c.ExecutionResult).value
    assert bound.queue_not_matched
    raw.send(c.ExchangeUnbind(queue=queue, exchange="amq.match", binding_key="k"), 1)
    assert raw.expect(c.ExecutionException).error_code == 404
    raw.close()


def test_an_exclusive_auto_delete_queue_outlives_its_cancelled_subscription(port):  # noqa: F811
    """queue.declare auto-delete (L7682ff): "If this field is set and the exclusive field is also set,
    then the queue MUST be deleted when the session closes" -- not when its subscription is cancelled."""
    raw = _raw_attached(port, "autodel")
    queue = _name("autodel")
    raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), 1)
    raw.send(c.MessageSubscribe(queue=queue, destination="d", accept_mode=0, acquire_mode=0), 1)
    raw.send(c.MessageCancel(destination="d"), 1)
    raw.send(c.QueueQuery(queue=queue, sync=True), 1)
    assert raw.expect(c.ExecutionResult).value.queue == queue
    raw.close()


def test_redeclaring_ignores_durable_auto_delete_and_own_exclusivity(port):  # noqa: F811
    """queue.declare rules pre-existence (L7723ff, L7737ff): "The server MUST ignore the durable field
    if the queue already exists" (auto-delete alike), exchange.declare rules sticky (L7193ff) the same
    for exchanges; and 0-10 has no rule refusing a session that redeclares its own exclusive queue
    without the flag (0-9-1's 405). None of these is an exception; the originals stay."""
    raw = _raw_attached(port, "sticky")
    queue, exchange = _name("sticky-q"), _name("sticky-x")
    raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), 1)
    raw.send(c.QueueDeclare(queue=queue, durable=True), 1)
    raw.send(c.ExchangeDeclare(exchange=exchange, type="direct", auto_delete=True), 1)
    raw.send(c.ExchangeDeclare(exchange=exchange, type="direct", durable=True), 1)
    raw.send(c.QueueQuery(queue=queue, sync=True), 1)
    got = _receive_on(raw, 2.0)
    assert not [m for m in got if isinstance(m, c.ExecutionException)], got
    result = next(m for m in got if isinstance(m, c.ExecutionResult)).value
    assert (result.durable, result.exclusive, result.auto_delete) == (False, True, True)
    raw.close()


def _header_size(queue: str) -> int:
    """The header segment the broker sends for a message published with only a routing key: its
    delivery-properties with the delivery's exchange ("") and routing key (no message-properties)."""
    return len(c.encode_struct32(c.DeliveryProperties(exchange="", routing_key=queue)))


def _publish(raw: Raw, queue: str, *bodies: bytes) -> None:
    for body in bodies:
        raw.send(c.MessageTransfer(destination="", accept_mode=1, acquire_mode=0,
                                   headers=[c.DeliveryProperties(routing_key=queue)], body=body), 1)


def _transfers(raw: Raw, timeout: float = 2.0) -> list[tuple[int, c.MessageTransfer]]:
    """(command id, transfer) of the transfers that arrive until ``timeout`` passes quietly: the id
    is the one session.command-point (L4625ff) set, counted up by each command the broker sends."""
    got, next_id = [], 0
    for method in _receive_on(raw, timeout):
        if isinstance(method, c.SessionCommandPoint):
            next_id = method.command_id
        elif isinstance(method, c.Command):
            if isinstance(method, c.MessageTransfer):
                got.append((next_id, method))
            next_id += 1
    return got


def test_byte_credit_counts_the_header_and_the_body(port):  # noqa: F811
    """message.set-flow-mode rule byte-accounting (L6118ff): "The byte count is decremented by the
    payload size of each transmitted frame with segment type header or body", and "if there is not
    enough byte credit available to send a complete message, the sender must either wait or use
    message fragmentation" (L6101ff): with credit one byte short of two transfers (header + 60-byte
    body each) only the first goes, and its header is the size counted; one more byte sends the second."""
    raw = _raw_attached(port, "bytes")
    queue = _name("bytes")
    raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), 1)
    _publish(raw, queue, b"A" * 60, b"B" * 60)
    size = _header_size(queue) + 60
    raw.send(c.MessageSubscribe(queue=queue, destination="b", accept_mode=1, acquire_mode=0), 1)
    raw.send(c.MessageSetFlowMode(destination="b", flow_mode=0), 1)  # credit mode
    raw.send(c.MessageFlow(destination="b", unit=0, value=10), 1)
    raw.send(c.MessageFlow(destination="b", unit=1, value=2 * size - 1), 1)
    got = [m for _, m in _transfers(raw)]
    assert [m.body[:1] for m in got] == [b"A"]
    assert sum(len(c.encode_struct32(h)) for h in got[0].headers) + len(got[0].body) == size
    raw.send(c.MessageFlow(destination="b", unit=1, value=1), 1)
    assert raw.expect(c.MessageTransfer).body == b"B" * 60
    raw.close()


def test_window_byte_credit_comes_back_with_completion(port):  # noqa: F811
    """message.set-flow-mode (L6104ff): in window mode "message transfer completion implicitly grants
    a single unit of message credit, and the size of the message in byte credits": with byte credit
    for exactly one transfer (message credit unlimited) one arrives, and completing it sends the next."""
    raw = _raw_attached(port, "wbytes")
    queue = _name("wbytes")
    raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), 1)
    _publish(raw, queue, b"1" * 30, b"2" * 30, b"3" * 30)
    raw.send(c.MessageSubscribe(queue=queue, destination="w", accept_mode=1, acquire_mode=0), 1)
    raw.send(c.MessageSetFlowMode(destination="w", flow_mode=1), 1)  # window mode
    raw.send(c.MessageFlow(destination="w", unit=1, value=_header_size(queue) + 30), 1)
    raw.send(c.MessageFlow(destination="w", unit=0, value=0xFFFFFFFF), 1)
    got = _transfers(raw)
    assert [m.body[:1] for _, m in got] == [b"1"]
    raw.send(c.SessionCompleted(commands=[(got[0][0], got[0][0])]), 1)
    again = _transfers(raw)
    assert [m.body[:1] for _, m in again] == [b"2"]
    raw.close()


def test_stop_zeroes_credit_and_only_flow_restarts_delivery(port):  # noqa: F811
    """message.stop (L6186ff): "a producer of messages MUST set his credit to zero for the given
    destination ... no further messages will be sent until such a time as further credit is
    received": in window mode, completing transfers sent before the stop gives no credit back; a
    message.flow afterwards delivers again (Qpid's test_window_stop)."""
    raw = _raw_attached(port, "stop")
    queue = _name("stop")
    raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), 1)
    _publish(raw, queue, *(b"m%d" % i for i in range(4)))
    raw.send(c.MessageSubscribe(queue=queue, destination="s", accept_mode=1, acquire_mode=0), 1)
    raw.send(c.MessageSetFlowMode(destination="s", flow_mode=1), 1)
    raw.send(c.MessageFlow(destination="s", unit=0, value=2), 1)
    raw.send(c.MessageFlow(destination="s", unit=1, value=0xFFFFFFFF), 1)
    got = _transfers(raw)
    assert [m.body for _, m in got] == [b"m0", b"m1"]
    raw.send(c.MessageStop(destination="s"), 1)
    raw.send(c.SessionCompleted(commands=[(got[0][0], got[1][0])]), 1)
    assert _transfers(raw, 1.5) == []
    raw.send(c.MessageFlow(destination="s", unit=0, value=1), 1)
    raw.send(c.MessageFlow(destination="s", unit=1, value=0xFFFFFFFF), 1)
    assert [m.body for _, m in _transfers(raw)] == [b"m2"]
    raw.close()


def test_passive_declare_inspects_another_sessions_exclusive_queue(port):  # noqa: F811
    """queue.declare passive (L7663ff) "allows the client to assert the presence of a queue without
    modifying the server state": another session may assert a session's exclusive queue (Qpid's
    request/reply clients do); asking for exclusive use of it, passive or not, is in-use
    (L7781ff: resource-locked, 405), and a missing queue is passive's not-found (L7770ff)."""
    raw = _raw_attached(port, "owner")
    queue = _name("exclusive")
    raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), 1)
    raw.send(c.QueueQuery(queue=queue), 1)
    assert raw.expect(c.ExecutionResult).value.exclusive
    other = _raw_attached(port, "asker")
    other.send(c.QueueDeclare(queue=queue, passive=True), 1)
    other.send(c.QueueQuery(queue=queue), 1)
    assert other.expect(c.ExecutionResult).value.queue == queue  # no exception came first
    other.send(c.QueueDeclare(queue=queue, passive=True, exclusive=True), 1)
    assert other.expect(c.ExecutionException).error_code == 405
    other.close()
    missing = _exception_for(port, c.QueueDeclare(queue=_name("missing"), passive=True))
    assert missing.error_code == 404
    raw.close()


def test_no_local_queue_drops_what_its_holders_connection_publishes(port):  # noqa: F811
    """Qpid's no-local queue argument (0-10 has no no-local on message.subscribe; the file and stream
    classes' consume say "the server will not send messages to the connection that published
    them"): on a queue a session declared exclusive with no-local, messages from that connection --
    this session or another on it -- are not queued; one from another connection is (Qpid's
    test_no_local, test_no_local_awkward: the queue is left empty)."""
    raw = _raw_attached(port, "nolocal")
    queue = _name("nolocal")
    raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True, arguments={"no-local": "true"}), 1)
    _publish(raw, queue, b"mine")
    raw.send(c.SessionAttach(name=_name("sibling").encode()), 2)
    raw.expect(c.SessionAttached)
    raw.send(c.SessionCommandPoint(command_id=0, command_offset=0), 2)
    raw.send(c.MessageTransfer(destination="", accept_mode=1, acquire_mode=0,
                               headers=[c.DeliveryProperties(routing_key=queue)], body=b"sibling"), 2)
    raw.send(c.ExecutionSync(), 2)
    other = _raw_attached(port, "foreign")
    _publish(other, queue, b"foreign")
    other.send(c.QueueQuery(queue=queue), 1)
    other.expect(c.ExecutionResult)  # the publish before it is applied
    raw.send(c.MessageSubscribe(queue=queue, destination="n", accept_mode=1, acquire_mode=0), 1)
    raw.send(c.MessageFlow(destination="n", unit=0, value=0xFFFFFFFF), 1)
    raw.send(c.MessageFlow(destination="n", unit=1, value=0xFFFFFFFF), 1)
    assert [m.body for _, m in _transfers(raw)] == [b"foreign"]
    raw.send(c.QueueQuery(queue=queue), 1)
    assert raw.expect(c.ExecutionResult).value.message_count == 0
    other.close()
    raw.close()


@pytest.mark.parametrize("exclusive", [True, False])
def test_an_auto_deleted_queues_messages_go_to_its_alternate(port, exclusive):  # noqa: F811
    """queue.declare alternate-exchange (L7656ff): "orphaned by queue deletion ... MUST be routed to
    the alternate-exchange" -- also when auto-delete (L7682ff) deletes the queue: an exclusive one
    when its session ends, a shared one when its last subscriber's session ends.  The one acquired
    and not accepted goes too, in queue order (Qpid's test_queue_autodelete)."""
    watcher = _raw_attached(port, "watch")
    alternate, catch, queue = _name("ad-alt"), _name("ad-catch"), _name("ad-queue")
    watcher.send(c.ExchangeDeclare(exchange=alternate, type="fanout", auto_delete=True), 1)
    watcher.send(c.QueueDeclare(queue=catch, exclusive=True, auto_delete=True), 1)
    watcher.send(c.ExchangeBind(queue=catch, exchange=alternate, binding_key=""), 1)
    watcher.send(c.QueueQuery(queue=catch), 1)
    assert watcher.expect(c.ExecutionResult).value.queue == catch  # bound before the other session starts
    raw = _raw_attached(port, "autodelete")
    raw.send(c.QueueDeclare(queue=queue, alternate_exchange=alternate, exclusive=exclusive, auto_delete=True), 1)
    _publish(raw, queue, b"one", b"two", b"three")
    raw.send(c.MessageSubscribe(queue=queue, destination="d", accept_mode=0, acquire_mode=0), 1)
    raw.send(c.MessageFlow(destination="d", unit=0, value=1), 1)
    raw.send(c.MessageFlow(destination="d", unit=1, value=0xFFFFFFFF), 1)
    assert raw.expect(c.MessageTransfer).body == b"one"
    raw.close()  # the session (timeout 0) ends with its connection
    watcher.send(c.MessageSubscribe(queue=catch, destination="c", accept_mode=1, acquire_mode=0), 1)
    watcher.send(c.MessageFlow(destination="c", unit=0, value=0xFFFFFFFF), 1)
    watcher.send(c.MessageFlow(destination="c", unit=1, value=0xFFFFFFFF), 1)
    assert [m.body for _, m in _transfers(watcher, 5.0)] == [b"one", b"two", b"three"]
    watcher.send(c.QueueQuery(queue=queue), 1)
    assert watcher.expect(c.ExecutionResult).value.queue is None  # auto-deleted
    watcher.close()


def test_messages_orphaned_by_queue_deletion_go_to_the_alternate_exchange(port):  # noqa: F811
    """queue.declare alternate-exchange (L7656ff): "rejected or orphaned messages MUST be routed to
    the alternate-exchange" -- here one message still queued and one acquired by a subscriber
    (not accepted) when the queue is deleted: both arrive in the queue bound to the alternate."""
    raw = _raw_attached(port, "orphans")
    alternate, queue, catch = _name("alt-x"), _name("orphans"), _name("catch")
    raw.send(c.ExchangeDeclare(exchange=alternate, type="fanout", auto_delete=True), 1)
    raw.send(c.QueueDeclare(queue=catch, exclusive=True, auto_delete=True), 1)
    raw.send(c.ExchangeBind(queue=catch, exchange=alternate, binding_key=""), 1)
    raw.send(c.QueueDeclare(queue=queue, alternate_exchange=alternate, exclusive=True, auto_delete=True), 1)
    for body in (b"acquired", b"queued"):
        raw.send(c.MessageTransfer(destination="", accept_mode=1, acquire_mode=0,
                                   headers=[c.DeliveryProperties(routing_key=queue)], body=body), 1)
    raw.send(c.MessageSubscribe(queue=queue, destination="d", accept_mode=0, acquire_mode=0), 1)
    raw.send(c.MessageFlow(destination="d", unit=0, value=1), 1)
    raw.send(c.MessageFlow(destination="d", unit=1, value=0xFFFFFFFF), 1)
    assert raw.expect(c.MessageTransfer).body == b"acquired"
    raw.send(c.QueueDelete(queue=queue), 1)
    raw.send(c.QueueQuery(queue=catch, sync=True), 1)
    assert raw.expect(c.ExecutionResult).value.message_count == 2
    raw.close()


def test_a_new_session_works_on_the_channel_after_a_not_allowed_exception(port):  # noqa: F811
    """3.4.1.3: every execution exception ends the session, including those the core words as
    0-9-1 connection errors (here 530): a new session attached on the same channel then executes
    its commands (Qpid's own alternate-exchange tests do exactly this)."""
    raw = _raw_attached(port, "hard")
    name = _name("hard")
    raw.send(c.ExchangeDeclare(exchange=name, type="fanout", auto_delete=True), 1)
    raw.send(c.ExchangeDeclare(exchange=name, type="fanout", alternate_exchange="amq.fanout"), 1)
    assert raw.expect(c.ExecutionException).error_code == 530
    detach = raw.expect(c.SessionDetach)
    raw.send(c.SessionDetached(name=detach.name, code=0), 1)
    raw.send(c.SessionAttach(name=_name("after").encode()), 1)
    raw.expect(c.SessionAttached)
    raw.send(c.SessionCommandPoint(command_id=0, command_offset=0), 1)
    raw.send(c.ExchangeQuery(name=name, sync=True), 1)
    assert raw.expect(c.ExecutionResult).value.type == "fanout"
    raw.close()


def test_exchange_bound_judges_queue_and_key_separately(port):  # noqa: F811
    """exchange.bound result (L7560ff): queue-not-matched "no binding was found from the specified
    exchange to the specified queue", key-not-matched "no binding was found from the specified
    exchange with the specified binding-key" -- a key bound for another queue is matched (Qpid's
    own query tests ask exactly this)."""
    raw = _raw_attached(port, "bound2")
    used, unused = _name("used"), _name("unused")
    for queue in (used, unused):
        raw.send(c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True), 1)
    raw.send(c.ExchangeBind(queue=used, exchange="amq.direct", binding_key=used), 1)
    raw.send(c.ExchangeBound(exchange="amq.direct", queue=unused, binding_key=used, sync=True), 1)
    answer = raw.expect(c.ExecutionResult).value
    assert answer.queue_not_matched and not answer.key_not_matched and not answer.queue_not_found
    raw.close()


def test_a_passive_exchange_declare_needs_no_type(port):  # noqa: F811
    """exchange.declare passive (L7147ff) "do not create exchange" and exception not-found (L7242ff):
    a passive declare of a missing exchange without a type is not-found (404), not a missing field."""
    exc = _exception_for(port, c.ExchangeDeclare(exchange=_name("humpty"), passive=True))
    assert exc.error_code == 404


def test_unbind_of_a_missing_queue_or_exchange_is_not_found(port):  # noqa: F811
    """exchange.unbind exceptions non-existent-queue (L7486ff) and non-existent-exchange (L7492ff):
    "If the queue does not exist the server MUST raise an exception" -- not-found (404), whereas the
    0-9-1 front end answers unbind-ok for the same case (RabbitMQ's rule, issue 32)."""
    queue = _name("unbind-gone")
    declare = c.QueueDeclare(queue=queue, exclusive=True, auto_delete=True)
    for command, says in ((c.ExchangeUnbind(queue=_name("no-queue"), exchange="amq.direct", binding_key="k"),
                           "non-existent-queue"),
                          (c.ExchangeUnbind(queue=queue, exchange=_name("no-exchange"), binding_key="k"),
                           "non-existent-exchange")):
        exc = _exception_for(port, declare, command)
        assert exc.error_code == 404 and says in str(exc.description), (command, exc)
