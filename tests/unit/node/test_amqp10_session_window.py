"""node/amqp10/session.py: deliveries and the client's session incoming-window (issue 31 item 2).

AMQP 1.0 2.5.6 (session flow control): the sender MUST NOT send a transfer frame while the remote
incoming-window is 0; each transfer frame uses one unit of it; the receiver's flow sets it to
next-incoming-id + incoming-window - next-outgoing-id.  2.6.14: a delivery's frames after the first
carry ``more`` until the last.  The session is driven through a recording connection (no sockets).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from raftmq.node.amqp10.session import Session
from raftmq.node.config import Config
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10.frames import FrameReader, encode_frame


@dataclass
class Conn:
    """What a Session uses of its connection; frames are recorded as (performative, payload)."""

    remote_max_frame: int = 512
    _write_paused: bool = False
    delivery_bytes: int = 0
    written: int = 0
    frames: list = field(default_factory=list)
    config: Config = field(default_factory=Config)  # the session reads its caps from it (amqp10_link_max_per_session)

    def send(self, channel: int, performative, payload: bytes = b"") -> None:
        self.frames.extend((f.performative, f.payload) for f in FrameReader(1 << 20).feed(
            encode_frame(performative, channel, payload)))

    def send_raw(self, data: bytes) -> None:
        self.frames.extend((f.performative, f.payload) for f in FrameReader(1 << 20).feed(data))

    def wrote(self, size: int) -> None:
        self.written += size


@dataclass(eq=False)
class Link:
    handle: int = 0
    resumed: int = 0

    def resume_sending(self) -> None:
        self.resumed += 1

    def release(self) -> None:
        pass


def session_with(window: int) -> tuple[Conn, Session, Link]:
    conn = Conn()
    session = Session(conn, 0, p.Begin(next_outgoing_id=0, incoming_window=window, outgoing_window=100))
    link = Link()
    session.links[link.handle] = link
    return conn, session, link


def transfers(conn: Conn) -> list[tuple]:
    out = [(perf, payload) for perf, payload in conn.frames if isinstance(perf, p.Transfer)]
    conn.frames.clear()
    return out


def test_a_delivery_is_cut_at_the_window_and_finished_after_the_flow() -> None:
    """A delivery of ~5 frames into a window of 2: two frames go (the first with delivery-id and tag,
    ``more`` set), the rest waits -- counted in the connection's delivery bytes (memory alarm) -- and the
    session is blocked; the client's flow (next-incoming-id 2, window 10) sends the other frames, the
    last without ``more``, and the bytes joined are the delivery."""
    conn, session, link = session_with(2)
    data = bytes(range(256)) * 8  # 2048 octets: 5 frames of < 512
    session.send_delivery(link, 7, False, data, b"tag")
    first = transfers(conn)
    assert len(first) == 2 and first[0][0].delivery_id == 0 and first[0][0].delivery_tag == b"tag"
    assert all(perf.more for perf, _ in first)
    assert session.remote_incoming_window == 0 and session.blocked()
    assert conn.delivery_bytes == len(data) - sum(len(x) for _, x in first) > 0
    session.resume_sending()
    assert transfers(conn) == []  # still no window: nothing more
    session._on_flow(p.Flow(next_incoming_id=2, incoming_window=10, next_outgoing_id=0, outgoing_window=100))
    rest = transfers(conn)
    assert [perf.more for perf, _ in rest] == [True] * (len(rest) - 1) + [False]
    assert all(perf.delivery_id is None for perf, _ in rest)  # continuation frames
    assert b"".join(x for _, x in first + rest) == data
    assert conn.delivery_bytes == 0 and not session.blocked()
    assert session.unsettled == {0: (link, 7)}


def test_nothing_is_sent_into_a_zero_window_and_waiting_links_resume_in_order() -> None:
    """Window 0 at begin: a delivery waits whole (no frame); links that hold deliveries by reference
    (``waiting``) are asked to send only once the window opens, in the order they started waiting."""
    conn, session, link = session_with(0)
    other = Link(handle=1)
    session.links[1] = other
    session.send_delivery(link, None, True, b"x" * 100)
    assert transfers(conn) == [] and session.blocked() and conn.delivery_bytes == 100
    session.waiting[other] = None
    session._on_flow(p.Flow(next_incoming_id=0, incoming_window=0, next_outgoing_id=0, outgoing_window=100))
    assert transfers(conn) == [] and other.resumed == 0
    session._on_flow(p.Flow(next_incoming_id=0, incoming_window=5, next_outgoing_id=0, outgoing_window=100))
    (perf, payload), = transfers(conn)
    assert perf.settled and payload == b"x" * 100 and conn.delivery_bytes == 0
    assert other.resumed == 1 and session.waiting == {}


def test_a_full_write_buffer_blocks_links_but_not_the_window() -> None:
    """The write buffer past its high-water mark (connection._write_paused) blocks the links' sending
    (they hold by reference), though the client's window is open."""
    conn, session, _link = session_with(100)
    assert not session.blocked()
    conn._write_paused = True
    assert session.blocked()


def test_an_ended_session_drops_what_waits_and_its_bytes() -> None:
    """What waits for a window is not sent once the session ends, and no longer counted."""
    conn, session, link = session_with(0)
    session.send_delivery(link, 1, False, b"y" * 300)
    assert conn.delivery_bytes == 300
    session.on_end(p.End())
    assert conn.delivery_bytes == 0 and not session.parked
