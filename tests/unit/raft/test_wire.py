"""raft.wire: the Raft transport's framing, over real loopback sockets and pysyncobj's poller."""

from __future__ import annotations

import os
import socket
import struct
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pysyncobj.poller import createPoller

from raftmq.raft.wire import HANDSHAKE_FRAME_BYTES, FrameError, SealedConnection, Sealer


class Pair:
    """Two SealedConnections over a loopback TCP connection, with pysyncobj's key handshake: the
    connecting side sends a fresh random key, the accepting side answers with its own."""

    def __init__(self, client_secret: str | None, server_secret: str | None) -> None:
        self.poller = createPoller("auto")
        self.received: dict[str, list] = {"client": [], "server": []}
        self.closed: set[str] = set()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self.client = SealedConnection(self.poller, onMessageReceived=self._client_got,
                                       onConnected=self._client_connected,
                                       onDisconnected=lambda: self.closed.add("client"))
        self.client.encryptor = Sealer(client_secret) if client_secret else None
        assert self.client.connect("127.0.0.1", listener.getsockname()[1])
        sock, _ = listener.accept()
        listener.close()
        sock.setblocking(False)
        self.server = SealedConnection(self.poller, socket=sock, onMessageReceived=self._server_got,
                                       onDisconnected=lambda: self.closed.add("server"))
        self.server.encryptor = Sealer(server_secret) if server_secret else None

    def _client_connected(self) -> None:
        if self.client.encryptor:
            self.client.recvRandKey = os.urandom(32)
            self.client.send(self.client.recvRandKey)

    def _client_got(self, message) -> None:
        if self.client.encryptor and not self.client.sendRandKey:
            self.client.sendRandKey = message
            return
        self.received["client"].append(message)

    def _server_got(self, message) -> None:
        if self.server.encryptor and not self.server.sendRandKey:
            self.server.sendRandKey = message
            self.server.recvRandKey = os.urandom(32)
            self.server.send(self.server.recvRandKey)
            return
        self.received["server"].append(message)

    def run_until(self, condition, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            self.poller.poll(0.01)
        return condition()

    def handshake(self) -> None:
        assert self.run_until(lambda: self.client.sendRandKey is not None and self.server.sendRandKey is not None)

    def close(self) -> None:
        self.client.disconnect()
        self.server.disconnect()


@pytest.fixture
def pair_factory():
    pairs: list[Pair] = []

    def make(client_secret="cluster secret", server_secret="cluster secret") -> Pair:
        pairs.append(Pair(client_secret, server_secret))
        return pairs[-1]

    yield make
    for pair in pairs:
        pair.close()


def test_messages_larger_than_the_socket_buffer_arrive_whole_in_both_directions(pair_factory):
    """An 8 MiB message is far above the socket buffer; it must arrive without any later send
    (pysyncobj waited for the next send to move the rest of a partly sent buffer)."""
    pair = pair_factory()
    pair.handshake()
    big = os.urandom(8 << 20)
    pair.client.send({"type": "append_entries", "entries": [(big, 7, 2)]})
    pair.server.send(["small", 1])
    assert pair.run_until(lambda: pair.received["server"] and pair.received["client"])
    assert pair.received["server"] == [{"type": "append_entries", "entries": [(big, 7, 2)]}]
    assert pair.received["client"] == [["small", 1]]
    assert not pair.closed


def test_many_messages_keep_their_order(pair_factory):
    pair = pair_factory()
    pair.handshake()
    for i in range(500):
        pair.client.send(("entry", i, os.urandom(i)))
    assert pair.run_until(lambda: len(pair.received["server"]) == 500)
    assert [m[1] for m in pair.received["server"]] == list(range(500))


def test_a_peer_with_another_secret_is_disconnected_before_anything_is_delivered(pair_factory):
    pair = pair_factory(client_secret="intruder", server_secret="cluster secret")
    pair.client.send(["status"])  # whatever it sends after its (undecryptable) key
    assert pair.run_until(lambda: "server" in pair.closed)
    assert pair.received["server"] == []
    assert pair.server.sendRandKey is None  # the key exchange never completed


def test_an_oversized_frame_before_the_handshake_is_refused_without_reading_it(pair_factory):
    pair = pair_factory()
    # The client announces a frame far above the pre-handshake limit and sends nothing else.
    pair.client._write_buffer().extend(struct.pack("<I", HANDSHAKE_FRAME_BYTES + 1))
    pair.client._TcpConnection__trySendBuffer()
    assert pair.run_until(lambda: "server" in pair.closed)
    assert pair.received["server"] == []


def test_without_a_secret_frames_are_plain_pickles(pair_factory):
    pair = pair_factory(client_secret=None, server_secret=None)
    pair.client.send({"x": b"\x00" * 10})
    assert pair.run_until(lambda: pair.received["server"])
    assert pair.received["server"] == [{"x": b"\x00" * 10}]


# ---------------------------------------------------------------- the sealer on its own


def _ends(sealer: Sealer):
    key = os.urandom(32)
    fields = dict(tx_key_for=None, tx_aead=None, tx_count=0, rx_key_for=None, rx_aead=None, rx_count=0)
    sender = SimpleNamespace(sendRandKey=key, recvRandKey=None, **fields)
    receiver = SimpleNamespace(sendRandKey=None, recvRandKey=key, **fields)
    return sender, receiver


def _frame(sealer: Sealer, conn, plain: bytes) -> memoryview:
    nonce, sealed = sealer.seal(conn, plain)
    return memoryview(nonce + sealed)


def test_session_frames_must_arrive_exactly_in_sequence():
    sealer = Sealer("s")
    sender, receiver = _ends(sealer)
    first, second, third = (_frame(sealer, sender, p) for p in (b"one", b"two", b"three"))
    assert sealer.open(receiver, first) == b"one"
    with pytest.raises(FrameError, match="sequence"):
        sealer.open(receiver, first)  # a replay
    with pytest.raises(FrameError, match="sequence"):
        sealer.open(receiver, third)  # "two" was dropped
    assert sealer.open(receiver, second) == b"two"
    assert sealer.open(receiver, third) == b"three"


def test_a_tampered_frame_fails_authentication():
    sealer = Sealer("s")
    sender, receiver = _ends(sealer)
    frame = bytearray(_frame(sealer, sender, b"payload"))
    frame[-1] ^= 1
    with pytest.raises(FrameError, match="authentication"):
        sealer.open(receiver, memoryview(bytes(frame)))


def test_session_keys_are_bound_to_the_connection_key():
    """A frame recorded on one connection does not open on another (its random key differs)."""
    sealer = Sealer("s")
    sender, _ = _ends(sealer)
    _, other_receiver = _ends(sealer)
    with pytest.raises(FrameError):
        sealer.open(other_receiver, _frame(sealer, sender, b"recorded"))


_FUZZ_SEALER = Sealer("fuzz")


@settings(max_examples=300, deadline=None)
@given(frame=st.binary(max_size=200), session=st.booleans())
def test_any_bytes_either_open_as_the_next_frame_or_raise_frame_error(frame, session):
    """Nothing but FrameError comes out of opening a frame an attacker made up (no pickle is
    reached: the caller unpickles only what opened)."""
    sender, receiver = _ends(_FUZZ_SEALER)
    if not session:
        receiver.recvRandKey = None
    with pytest.raises(FrameError):
        _FUZZ_SEALER.open(receiver, memoryview(frame))


def test_a_reused_random_key_still_gets_fresh_nonces():
    """Replaying a recorded handshake can make a node send under a random key it used before; the
    session's random nonce prefix keeps AES-GCM nonces from repeating under that key."""
    sealer = Sealer("s")
    first, _ = _ends(sealer)
    second = SimpleNamespace(**vars(first))  # the same random key, a new session
    second.tx_key_for, second.tx_count = None, 0
    nonce_a, _ = sealer.seal(first, b"x")
    nonce_b, _ = sealer.seal(second, b"x")
    assert nonce_a != nonce_b
