"""The Raft transport's framing: pickle protocol 5 sealed with AES-GCM, in growable buffers.

pysyncobj frames every message as ``zlib.compress(pickle.dumps(message, protocol=2), 3)`` and
then Fernet (AES-CBC + HMAC + base64), separately for each follower.  Profiled on the 3-node
publish benchmark this was most of the leader's Raft thread (pickle 28 %, zlib 24 %), and
measured on one 1 MiB batch of message bodies: protocol-2 pickle 9.9 ms (it turns ``bytes`` into
latin-1 text, 1.5x larger), zlib 88 ms on incompressible bodies, Fernet 8.5 ms -- against 0.2 ms
for protocol-5 pickle and 0.2 ms for AES-GCM.  Bodies are the client's data: compressing them
is the client's business.

:class:`SealedConnection` replaces pysyncobj's ``TcpConnection`` in the modules that create
connections (:func:`install`).  What stays the same is pysyncobj's handshake: each side of a
connection sends a fresh random key (``recvRandKey``) sealed under the cluster key, and the other
side sends under it (``sendRandKey``).  What changes:

* **Framing**: ``u32 length | nonce (12) | AES-GCM(pickle protocol 5)``.  No compression.
* **Keys**: the handshake frames are sealed with the cluster key (PBKDF2 of the secret) and
  random nonces.  Everything after is sealed with a per-direction session key,
  HMAC-SHA256(cluster key, random key).  Its nonce is 4 random bytes the sender picks for the
  session, then a 64-bit counter, and the receiver requires exactly the next counter: a frame
  replayed, dropped or reordered by the network closes the connection (pysyncobj's Fernet
  timestamps only rejected frames older than the last one, to the second).  The random part keeps
  nonces unique even if a recorded handshake is replayed to make a node reuse a random key.  A
  frame that fails authentication is logged and closes the connection before anything is
  unpickled.
* **Sending**: a message that does not fit the socket buffer subscribes the connection for
  writability, so the rest goes out as the peer reads (pysyncobj left it until the next send).
* **Buffers**: ``bytearray`` read and write buffers consumed from the front (``del buf[:n]`` is
  O(1) amortised), instead of ``bytes`` re-sliced on every partial send and re-concatenated on
  every ``recv``, which copied a large message once per socket-buffer-sized chunk.

Every node of a cluster must run this framing (it is not wire-compatible with stock pysyncobj);
the cluster admin client (:func:`admin_utility`) uses it too.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import hmac
import logging
import os
import pickle
import struct
import time

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pysyncobj import tcp_server as _tcp_server
from pysyncobj import transport as _transport
from pysyncobj import utility as _utility
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import TcpConnection

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("<I")
_COUNTER = struct.Struct(">Q")  # a session nonce: 4 random bytes per session, then this counter
NONCE_BYTES = 12
READ_CHUNK = 256 << 10
# Largest frame accepted: an AppendEntries of up to 4 MiB of entries plus one entry that may hold a
# 128 MiB message, with room.  Before the handshake (keys not yet exchanged) frames are tiny, so an
# unauthenticated peer cannot make the node buffer more than HANDSHAKE_FRAME_BYTES.
MAX_FRAME_BYTES = 512 << 20
HANDSHAKE_FRAME_BYTES = 64 << 10
PICKLE_PROTOCOL = 5
_WATCH_WRITABLE = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR
_SALT = b"raftmq raft transport v1"
_KDF_ITERATIONS = 200_000


class FrameError(Exception):
    """A frame that is not the next authentic frame of this connection."""


class Sealer:
    """Seals and opens frames for every connection of one node, with keys from the cluster secret."""

    def __init__(self, secret: str | bytes) -> None:
        if isinstance(secret, str):
            secret = secret.encode()
        self._cluster_key = hashlib.pbkdf2_hmac("sha256", secret, _SALT, _KDF_ITERATIONS, 32)
        self._cluster = AESGCM(self._cluster_key)

    def session(self, random_key: bytes) -> AESGCM:
        """The key of one direction of one connection, bound to the receiver's fresh random key."""
        return AESGCM(hmac.new(self._cluster_key, b"session" + random_key, hashlib.sha256).digest())

    def seal(self, conn: SealedConnection, plain: bytes) -> tuple[bytes, bytes]:
        """(nonce, ciphertext) for the next frame ``conn`` sends."""
        random_key = conn.sendRandKey
        if random_key is None:  # handshake: the cluster key, a random nonce
            nonce = os.urandom(NONCE_BYTES)
            return nonce, self._cluster.encrypt(nonce, plain, None)
        aead = conn.tx_aead
        if aead is None or conn.tx_key_for is not random_key:  # (None: no session key yet)
            aead = self.session(random_key)
            conn.tx_key_for, conn.tx_aead, conn.tx_count = random_key, aead, 0
            conn.tx_prefix = os.urandom(4)
        conn.tx_count += 1
        nonce = conn.tx_prefix + _COUNTER.pack(conn.tx_count)
        return nonce, aead.encrypt(nonce, plain, None)

    def open(self, conn: SealedConnection, frame: memoryview) -> bytes:
        """The plaintext of ``frame``, which must be the next frame of ``conn``; else FrameError."""
        if len(frame) < NONCE_BYTES:
            raise FrameError("frame shorter than its nonce")
        nonce, sealed = frame[:NONCE_BYTES], frame[NONCE_BYTES:]
        random_key = conn.recvRandKey
        try:
            if random_key is None:
                return self._cluster.decrypt(nonce, sealed, None)
            aead = conn.rx_aead
            if aead is None or conn.rx_key_for is not random_key:  # (None: no session key yet)
                aead = self.session(random_key)
                conn.rx_key_for, conn.rx_aead, conn.rx_count = random_key, aead, 0
                conn.rx_prefix = bytes(nonce[:4])  # the sender's, for this session
            if nonce != conn.rx_prefix + _COUNTER.pack(conn.rx_count + 1):
                raise FrameError("frame out of sequence (replayed, lost or reordered)")
            plain = aead.decrypt(nonce, sealed, None)
        except InvalidTag:
            raise FrameError("frame failed authentication (wrong cluster secret?)") from None
        conn.rx_count += 1
        return plain


class SealedConnection(TcpConnection):
    """pysyncobj's connection with :mod:`raft.wire`'s framing (see the module docstring)."""

    encryptor: Sealer | None
    tx_key_for: bytes | None = None
    tx_aead: AESGCM | None = None
    tx_count = 0
    tx_prefix = b""
    rx_key_for: bytes | None = None
    rx_aead: AESGCM | None = None
    rx_count = 0
    rx_prefix = b""
    last_byte_at = 0.0  # time.monotonic() of the last bytes read
    # pysyncobj's buffers (bytes after connect() and disconnect(), made bytearrays here).
    _TcpConnection__writeBuffer: bytes | bytearray
    _TcpConnection__readBuffer: bytes | bytearray

    def send(self, message: object) -> None:
        plain = pickle.dumps(message, PICKLE_PROTOCOL)
        buffer = self._write_buffer()
        sealer = self.encryptor
        if sealer is None:
            buffer += _LENGTH.pack(len(plain))
            buffer += plain
        else:
            if not isinstance(sealer, Sealer):
                raise TypeError(f"SealedConnection needs a raft.wire.Sealer, not {type(sealer).__name__}")
            nonce, sealed = sealer.seal(self, plain)
            buffer += _LENGTH.pack(NONCE_BYTES + len(sealed))
            buffer += nonce
            buffer += sealed
        self._TcpConnection__trySendBuffer()
        if buffer and self._TcpConnection__fileno is not None:
            # pysyncobj watches for writability only after a write event, so a message larger
            # than the socket buffer waited for the *next* send to move on: ask for the event.
            self._TcpConnection__poller.subscribe(self._TcpConnection__fileno, self._TcpConnection__processConnection,
                                                  _WATCH_WRITABLE)

    def _write_buffer(self) -> bytearray:
        buffer = self._TcpConnection__writeBuffer
        if buffer.__class__ is not bytearray:  # connect() and disconnect() reset it to bytes()
            buffer = self._TcpConnection__writeBuffer = bytearray(buffer)
        return buffer

    def _read_buffer(self) -> bytearray:
        buffer = self._TcpConnection__readBuffer
        if buffer.__class__ is not bytearray:
            buffer = self._TcpConnection__readBuffer = bytearray(buffer)
        return buffer

    # pysyncobj's private methods, overridden under their mangled names.

    def _TcpConnection__processSend(self) -> bool:  # noqa: N802 (pysyncobj's name)
        buffer = self._write_buffer()
        if not buffer:
            return False
        try:
            sent = self._TcpConnection__socket.send(buffer)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if sent <= 0:
            if sent < 0:
                self.disconnect()
            return False
        del buffer[:sent]
        return True

    def _TcpConnection__processRead(self) -> bool:  # noqa: N802
        try:
            incoming = self._TcpConnection__socket.recv(READ_CHUNK)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if not incoming:
            self.disconnect()
            return False
        self._read_buffer().extend(incoming)
        self.last_byte_at = time.monotonic()  # raft/gate.py: a connection stalled mid-frame is closed
        return True

    def _TcpConnection__processParseMessage(self) -> object | None:  # noqa: N802
        buffer = self._read_buffer()
        if len(buffer) < 4:
            return None
        (length,) = _LENGTH.unpack_from(buffer)
        limit = MAX_FRAME_BYTES if self.recvRandKey is not None or self.encryptor is None else HANDSHAKE_FRAME_BYTES
        if length > limit:
            log.warning("raft connection closed: a %d-byte frame (limit %d)", length, limit)
            self.disconnect()
            return None
        end = 4 + length
        if len(buffer) < end:
            return None
        with memoryview(buffer) as view:
            frame = view[4:end].tobytes()  # one copy, so that the buffer can be cut below
        del buffer[:end]
        sealer = self.encryptor
        try:
            plain = frame if sealer is None else sealer.open(self, memoryview(frame))
            return pickle.loads(plain)
        except FrameError as exc:
            log.warning("raft connection closed: %s", exc)
        except Exception as exc:  # a corrupt frame from an authenticated peer, or no secret
            log.warning("raft connection closed: undecodable frame (%s)", exc)
        self.disconnect()
        return None


_PATCHED_MODULES = (_tcp_server, _transport, _utility)  # the modules that create connections


def install() -> None:
    """Make pysyncobj create :class:`SealedConnection` everywhere (idempotent, process-wide)."""
    for module in _PATCHED_MODULES:
        module.TcpConnection = SealedConnection


@functools.lru_cache(maxsize=4)
def _sealer(secret: str) -> Sealer:
    """One Sealer per secret for the process's admin clients: deriving the cluster key costs
    ``_KDF_ITERATIONS`` of PBKDF2 (~100 ms), and every request between members (body fetches, the
    management UI's member views: ops/http/members.py) makes a new client.  A Sealer keeps no
    per-connection state (that is on the connection), so clients may share it across threads."""
    return Sealer(secret)


def admin_utility(secret: str, timeout: float) -> _utility.TcpUtility:
    """pysyncobj's admin client (status, add, remove, transfer) speaking this framing."""
    install()
    utility = _utility.TcpUtility(password=None, timeout=timeout)
    utility._TcpUtility__connection.encryptor = _sealer(secret)
    return utility

