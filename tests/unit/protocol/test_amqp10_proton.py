"""The AMQP 1.0 codec against a real client library: python-qpid-proton (Qpid Proton's C engine).

Proton's engine runs here without sockets: its Transport writes the octets a client sends (protocol
header, open, begin, attach, transfer, sasl-init) and reads the octets we push into it.  Our FrameReader
decodes what proton wrote, and proton accepts what our encoder wrote (open, begin, attach, flow,
disposition, sasl-mechanisms, sasl-outcome) and acts on it: its connection reports our container id, its
sender gets our credit, its delivery our outcome.  Values of every type go both ways through proton's
Data codec.  Spec: 2.2 (protocol header), 2.3 (frames), 2.7 (performatives), 3.2 (message sections),
5.3 (SASL), 1.6 (types).
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raftmq.protocol.amqp10 import frames as f
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t
from raftmq.protocol.amqp10.errors import DecodeError, FramingError

from .test_amqp10_types import ALLOC_CONSTANT, ALLOC_FACTOR, TIME_BOUND, bounded

proton = pytest.importorskip("proton")

SERVER_OPEN = p.Open(container_id="raftmq-test", max_frame_size=65536, channel_max=255,
                     offered_capabilities=["ANONYMOUS-RELAY"], properties={"product": "raftmq"})


def drain(transport) -> bytes:
    """Everything proton's transport has to send now."""
    out = b""
    while True:
        n = transport.pending()
        if n <= 0:
            return out
        out += transport.peek(n)
        transport.pop(n)


def client(sasl: bool = False):
    conn = proton.Connection()
    conn.container = "proton-client"
    conn.hostname = "localhost"
    transport = proton.Transport()
    transport.max_frame_size = 65536
    if sasl:
        conn.user, conn.password = "guest", "guest"
        s = transport.sasl()
        s.allow_insecure_mechs = True
        s.allowed_mechs("PLAIN")
    transport.bind(conn)
    return conn, transport


def frames_of(data: bytes) -> list[f.Frame]:
    return f.FrameReader(1 << 20).feed(data)


def test_proton_open_begin_attach_decode_and_proton_accepts_ours():
    """2.4.1 open exchange, 2.5.1 begin, 2.6.3 attach, 2.6.7 flow: both directions."""
    conn, transport = client()
    conn.open()
    session = conn.session()
    session.open()
    sender = session.sender("sender-link")
    sender.target.address = "/queues/q"
    sender.source.address = "client-src"
    sender.open()
    out = drain(transport)
    assert out[:8] == f.AMQP_HEADER
    got = frames_of(out[8:])
    assert [type(fr.performative) for fr in got] == [p.Open, p.Begin, p.Attach]
    open_, begin, attach = (fr.performative for fr in got)
    assert open_.container_id == "proton-client" and open_.hostname == "localhost"
    assert open_.max_frame_size == 65536
    assert begin.remote_channel is None and begin.next_outgoing_id == 0
    assert attach.name == "sender-link" and attach.role is False and attach.handle == 0
    assert isinstance(attach.source, p.Source) and attach.source.address == "client-src"
    assert isinstance(attach.target, p.Target) and attach.target.address == "/queues/q"
    assert attach.initial_delivery_count == 0
    # everything proton wrote re-encodes to frames proton's own reader would take: check by round trip
    for fr in got:
        assert p.decode_described(fr.performative.encode())[0] == fr.performative

    reply = f.AMQP_HEADER + b"".join([
        f.encode_frame(SERVER_OPEN),
        f.encode_frame(p.Begin(remote_channel=got[1].channel, next_outgoing_id=0, incoming_window=2048,
                               outgoing_window=2048, handle_max=31), channel=0),
        f.encode_frame(p.Attach(name="sender-link", handle=0, role=True, snd_settle_mode=2, rcv_settle_mode=0,
                                source=p.Source(address="client-src"), target=p.Target(address="/queues/q"),
                                max_message_size=1 << 20), channel=0),
        f.encode_frame(p.Flow(next_incoming_id=0, incoming_window=2048, next_outgoing_id=0, outgoing_window=2048,
                              handle=0, delivery_count=0, link_credit=10), channel=0),
    ])
    transport.push(reply)
    assert transport.condition is None, transport.condition
    assert conn.remote_container == "raftmq-test"
    assert conn.state & proton.Endpoint.REMOTE_ACTIVE
    assert session.state & proton.Endpoint.REMOTE_ACTIVE
    assert sender.state & proton.Endpoint.REMOTE_ACTIVE
    assert sender.credit == 10
    assert transport.remote_max_frame_size == 65536
    assert sender.remote_max_message_size == 1 << 20

    # a transfer: proton's message encoding decodes into our sections
    message = proton.Message(body="hello", subject="greeting", id="m-1", durable=True, priority=7,
                             properties={"colour": "red", "n": 3}, address="/queues/q")
    delivery = sender.delivery(b"tag-1")
    sender.send(message.encode())
    sender.advance()
    got = frames_of(drain(transport))
    transfers = [fr for fr in got if isinstance(fr.performative, p.Transfer)]
    assert len(transfers) == 1
    transfer = transfers[0].performative
    assert transfer.handle == 0 and transfer.delivery_id == 0 and transfer.delivery_tag == b"tag-1"
    assert transfer.message_format == 0 and not transfer.more
    sections = p.decode_sections(transfers[0].payload)
    kinds = [type(s) for s in sections]
    assert kinds == [p.Header, p.Properties, p.ApplicationProperties, p.AmqpValue]
    header, props, app, body = sections
    assert header.durable is True and header.priority == 7
    assert props.message_id == "m-1" and props.subject == "greeting" and props.to == "/queues/q"
    assert app.value == {"colour": "red", "n": 3}
    assert body.value == "hello"
    # our encoding of the same sections is a message proton decodes to the same fields
    again = proton.Message()
    again.decode(p.encode_sections(sections))
    assert (again.body, again.subject, again.id, again.priority, again.durable) == ("hello", "greeting", "m-1", 7,
                                                                                      True)
    assert again.properties == {"colour": "red", "n": 3}

    # our disposition settles proton's delivery with our outcome (2.7.6, 3.4.2)
    transport.push(f.encode_frame(p.Disposition(role=True, first=0, settled=True, state=p.Accepted())))
    assert transport.condition is None, transport.condition
    assert delivery.remote_state == proton.Delivery.ACCEPTED
    assert delivery.settled

    # a close with an error reaches proton as the remote condition (2.7.9, 2.8.14)
    transport.push(f.encode_frame(p.Close(error=p.Error(condition="amqp:connection:forced", description="bye",
                                                        info={"k": "v"}))))
    assert conn.remote_condition.name == "amqp:connection:forced"
    assert conn.remote_condition.description == "bye"


def test_proton_receiver_takes_our_transfer():
    """2.7.5 transfer written by us (with 3.2 sections), received and decoded by proton."""
    conn, transport = client()
    conn.open()
    session = conn.session()
    session.open()
    receiver = session.receiver("recv-link")
    receiver.source.address = "/queues/q"
    receiver.flow(5)
    receiver.open()
    got = frames_of(drain(transport)[8:])
    attach = next(fr.performative for fr in got if isinstance(fr.performative, p.Attach))
    assert attach.role is True
    flow = next(fr.performative for fr in got if isinstance(fr.performative, p.Flow))
    assert flow.link_credit == 5 and flow.handle == 0

    sections = [p.Header(durable=True), p.Properties(message_id=t.ULong(42), content_type="text/plain"),
                p.ApplicationProperties({"a": 1}), p.Data(b"payload octets")]
    transport.push(f.AMQP_HEADER + b"".join([
        f.encode_frame(SERVER_OPEN),
        f.encode_frame(p.Begin(remote_channel=0, next_outgoing_id=0, incoming_window=2048, outgoing_window=2048)),
        f.encode_frame(p.Attach(name="recv-link", handle=0, role=False, source=p.Source(address="/queues/q"),
                                target=p.Target(), initial_delivery_count=0)),
        f.encode_frame(p.Transfer(handle=0, delivery_id=0, delivery_tag=b"d0", message_format=0, settled=False),
                       payload=p.encode_sections(sections)),
    ]))
    assert transport.condition is None, transport.condition
    delivery = receiver.current
    assert delivery is not None and delivery.tag in (b"d0", "d0") and not delivery.partial
    message = proton.Message()
    message.decode(receiver.recv(delivery.pending))
    assert message.body == b"payload octets"
    assert message.id == 42 and message.content_type == "text/plain" and message.properties == {"a": 1}
    delivery.update(proton.Delivery.REJECTED)
    delivery.settle()
    disposition = next(fr.performative for fr in frames_of(drain(transport))
                       if isinstance(fr.performative, p.Disposition))
    assert disposition.role is True and disposition.first == 0 and disposition.settled
    assert isinstance(disposition.state, p.Rejected)


def test_proton_sasl_plain_exchange():
    """5.3.2: sasl-mechanisms from us, sasl-init (PLAIN) from proton, sasl-outcome from us."""
    conn, transport = client(sasl=True)
    conn.open()
    out = drain(transport)
    assert out[:8] == f.SASL_HEADER
    transport.push(f.SASL_HEADER + f.encode_frame(p.SaslMechanisms(sasl_server_mechanisms=["PLAIN", "ANONYMOUS"]),
                                                  frame_type=f.TYPE_SASL))
    out = drain(transport)
    got = frames_of(out[8:] if out.startswith(f.SASL_HEADER) else out)
    init = got[0].performative
    assert got[0].type == f.TYPE_SASL and isinstance(init, p.SaslInit)
    assert init.mechanism == "PLAIN" and init.initial_response == b"\x00guest\x00guest"
    transport.push(f.encode_frame(p.SaslOutcome(code=0), frame_type=f.TYPE_SASL) + f.AMQP_HEADER
                   + f.encode_frame(SERVER_OPEN))
    assert transport.sasl().outcome == proton.SASL.OK
    assert conn.remote_container == "raftmq-test"


# -- types through proton's Data codec -------------------------------------------------------------------------
def proton_values():
    """(proton value, our equal value) pairs covering the primitive types of 1.6."""
    u = uuid.UUID(int=0x1234)
    return [
        (None, None), (True, True), (False, False),
        (proton.ubyte(200), t.UByte(200)), (proton.ushort(60000), t.UShort(60000)),
        (proton.uint(0), t.UInt(0)), (proton.uint(7), t.UInt(7)), (proton.uint(1 << 31), t.UInt(1 << 31)),
        (proton.ulong(0), t.ULong(0)), (proton.ulong(9), t.ULong(9)), (proton.ulong(1 << 63), t.ULong(1 << 63)),
        (proton.byte(-5), t.Byte(-5)), (proton.short(-300), t.Short(-300)), (proton.int32(-7), t.Int(-7)),
        (proton.int32(1 << 20), t.Int(1 << 20)), (-3, t.Long(-3)), (1 << 40, t.Long(1 << 40)),
        (proton.float32(1.5), t.Float32(1.5)), (2.25, 2.25),
        (proton.decimal32(0x22500001), t.Decimal32(bytes.fromhex("22500001"))),
        (proton.decimal64(0x0102030405060708), t.Decimal64(bytes.fromhex("0102030405060708"))),
        (proton.decimal128(bytes(range(16))), t.Decimal128(bytes(range(16)))),
        (proton.char("x"), t.Char("x")), (proton.timestamp(1311704463521), t.Timestamp(1311704463521)),
        (u, u), (b"bin", b"bin"), (b"b" * 300, b"b" * 300), ("str", "str"), ("s" * 300, "s" * 300),
        (proton.symbol("sym"), t.Symbol("sym")),
        ([], []), ([1, "a", None], [1, "a", None]),
        ({proton.symbol("k"): 1, "s": [True]}, {t.Symbol("k"): 1, "s": [True]}),
        (proton.Array(proton.UNDESCRIBED, proton.Data.SYMBOL, proton.symbol("a"), proton.symbol("b")),
         t.Array("symbol", [t.Symbol("a"), t.Symbol("b")])),
        (proton.Array(proton.UNDESCRIBED, proton.Data.INT, 1, 2, 3), t.Array("int", [1, 2, 3])),
        (proton.Described(proton.ulong(0x24), []), t.Described(0x24, [])),
        (proton.Described(proton.symbol("x:y"), "v"), t.Described(t.Symbol("x:y"), "v")),
    ]


def proton_encode(value) -> bytes:
    data = proton.Data()
    data.put_object(value)
    return data.encode()


def proton_decode(encoded: bytes):
    data = proton.Data()
    data.decode(encoded)
    data.rewind()
    data.next()
    value = data.get_object()
    return bytes(value) if isinstance(value, memoryview) else value  # a view into ``data``: copy it now


@pytest.mark.parametrize(("theirs", "ours"), proton_values(), ids=lambda v: type(v).__name__)
def test_values_through_protons_data_codec(theirs, ours):
    """1.6: proton's encoding decodes to our value, ours decodes in proton to theirs."""
    assert t.decode(proton_encode(theirs)) == ours
    back = proton_decode(t.encode_value(ours))
    if isinstance(theirs, proton.Array):
        assert (back.type, back.elements) == (theirs.type, theirs.elements)
    elif isinstance(theirs, proton.Described):
        assert (back.descriptor, back.value) == (theirs.descriptor, theirs.value)
    else:
        assert back == theirs and type(back) is type(theirs)


def test_byte_identical_encodings():
    """Every scalar encodes to the same octets as proton's (both pick the smallest encoding: uint0,
    smalluint, smallint, str8...).  Lists, maps and arrays differ only in width: proton writes list32, map32
    and array32 even when small, we write list8/map8/array8 when size and count fit an octet (1.2.3, 1.2.4
    allow both); each decodes in the other's codec (test above)."""
    compound = {0xc0, 0xc1, 0xe0, 0xd0, 0xd1, 0xf0}
    for theirs, ours in proton_values():
        mine, proton_octets = t.encode_value(ours), proton_encode(theirs)
        if mine[0] in compound or (mine[0] == 0x00 and mine[3] in compound):
            assert t.decode(proton_octets) == t.decode(mine)
            assert proton_octets[0] in compound or proton_octets[3] in compound
        else:
            assert mine == proton_octets, (ours, mine.hex(), proton_octets.hex())


def test_frames_re_encoded_byte_for_byte():
    """Proton's open, begin and transfer frames, decoded and re-encoded by us, are the same octets.
    Attach differs in one way only: proton writes fields equal to their defaults (snd-settle-mode mixed,
    rcv-settle-mode first, a source's durable none, timeout 0, dynamic false) where we send null, which
    1.3.4 makes the same ("A default value for the field if no value is encoded"); it decodes equal."""
    out = proton_sends("sender-link", proton.Message(body="x"))
    pos, seen = 0, []
    while pos < len(out):
        size = int.from_bytes(out[pos:pos + 4], "big")
        raw = out[pos:pos + size]
        pos += size
        frame = frames_of(raw)[0]
        mine = f.encode_frame(frame.performative, frame.channel, frame.payload)
        name = type(frame.performative).__name__
        seen.append(name)
        if name == "Attach":
            assert mine != raw and len(mine) < len(raw)
            assert frames_of(mine)[0] == frame
        else:
            assert mine == raw, (name, raw.hex(), mine.hex())
    assert seen == ["Open", "Begin", "Attach", "Transfer"]


def proton_sends(link: str, message: proton.Message) -> bytes:
    """The frames proton writes (protocol header removed) to open a connection, a session and a sender
    link ``link`` to /queues/q, and, once our peer frames granted credit, to send ``message``."""
    conn, transport = client()
    conn.open()
    session = conn.session()
    session.open()
    sender = session.sender(link)
    sender.target.address = "/queues/q"
    sender.open()
    out = drain(transport)[8:]
    transport.push(f.AMQP_HEADER + f.encode_frame(SERVER_OPEN) + f.encode_frame(
        p.Begin(remote_channel=0, next_outgoing_id=0, incoming_window=100, outgoing_window=100))
        + f.encode_frame(p.Attach(name=link, handle=0, role=True, target=p.Target(address="/queues/q")))
        + f.encode_frame(p.Flow(incoming_window=100, next_outgoing_id=0, outgoing_window=100, handle=0,
                                delivery_count=0, link_credit=1)))
    sender.delivery(b"t")
    sender.send(message.encode())
    sender.advance()
    return out + drain(transport)


def _proton_stream() -> bytes:
    """Open, begin, attach and one transfer with a map body, properties and a subject."""
    return proton_sends("fuzz-link", proton.Message(body={"k": [1, 2.5, "x"]}, properties={"a": 1}, subject="s"))


PROTON_STREAM = _proton_stream()


def test_proton_stream_decodes_whole():
    assert [type(fr.performative) for fr in frames_of(PROTON_STREAM)] == [p.Open, p.Begin, p.Attach, p.Transfer]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(PROTON_STREAM) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       st.integers(1, 97))
def test_mutated_proton_frames_only_raise_codec_errors(flips, chunk):
    """Real client frames with octets changed, fed in chunks: frames, DecodeError or FramingError only,
    within the time and memory bounds of the other fuzz tests; decoded transfers' sections likewise."""
    data = bytearray(PROTON_STREAM)
    for index, octet in flips:
        data[index] = octet

    def run():
        reader = f.FrameReader(1 << 16)
        got = []
        for i in range(0, len(data), chunk):
            got += reader.feed(bytes(data[i:i + chunk]))
        for fr in got:
            if fr.payload:
                p.decode_sections(fr.payload)
        return got
    outcome, elapsed, peak = bounded(run)
    assert not isinstance(outcome, Exception) or isinstance(outcome, (DecodeError, FramingError)), repr(outcome)
    assert elapsed < TIME_BOUND
    assert peak < ALLOC_FACTOR * len(data) + ALLOC_CONSTANT
