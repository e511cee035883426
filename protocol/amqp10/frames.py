"""AMQP 1.0 framing (2.3) and protocol headers (2.2, 5.2.1, 5.3.1): bytes to frames and back.

A frame is an 8-octet header, an extended header and a body (2.3.1)::

    0  SIZE (uint32, the whole frame)   4  DOFF (uint8, 4-octet words)   5  TYPE   6  channel (uint16)

``TYPE`` 0x00 is an AMQP frame: its body is one performative (2.7) followed, for a transfer, by
payload octets (2.3.2).  ``TYPE`` 0x01 is a SASL frame (5.3.1): exactly one SASL body and channel
octets that are ignored.  The extended header (``DOFF`` * 4 - 8 octets) has no defined content: it is
skipped.  An AMQP frame with no body is an empty frame, sent to keep the idle timeout alive (2.4.5):
its ``performative`` is None.

Before the frames each side sends a protocol header (2.2): ``AMQP 0 1 0 0`` for AMQP,
``AMQP 3 1 0 0`` for the SASL layer (5.3.1), ``AMQP 2 1 0 0`` for TLS (5.2.1).
"""

from __future__ import annotations

from collections.abc import Container, Iterator
from dataclasses import dataclass
from struct import Struct

from . import performatives as p
from .errors import DecodeError, FramingError
from .types import new_budget

AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
TLS_HEADER = b"AMQP\x02\x01\x00\x00"
SASL_HEADER = b"AMQP\x03\x01\x00\x00"
PROTOCOL_IDS = {0: "amqp", 2: "tls", 3: "sasl"}
HEADER_SIZE = 8
#: 2.8.19 MIN-MAX-FRAME-SIZE: the largest frame before open is negotiated, and always for SASL (5.3.1).
MIN_MAX_FRAME_SIZE = 512
#: Default element budget of one frame's performative (Config ``amqp10_max_frame_elements``): the lists,
#: maps and arrays of an open, attach or flow a client sends hold tens of items (capabilities, filters,
#: properties); 4,096 is far beyond them, and the costliest frame within it (a 100 KB attach whose
#: properties map holds 2,040 string entries, or 4,080 symbols in an array) took 2.4-2.7 ms to decode here.
FRAME_ELEMENTS = 4096
TYPE_AMQP, TYPE_SASL = 0x00, 0x01

_HEADER = Struct(">IBBH")


@dataclass(frozen=True, slots=True)
class ProtocolHeader:
    """A protocol header (2.2): ``AMQP`` + protocol id + major + minor + revision."""

    protocol_id: int
    major: int
    minor: int
    revision: int

    @property
    def name(self) -> str | None:
        """"amqp", "tls" or "sasl" for 1.0.0 headers, else None (the peer should answer its own)."""
        if (self.major, self.minor, self.revision) != (1, 0, 0):
            return None
        return PROTOCOL_IDS.get(self.protocol_id)

    def encode(self) -> bytes:
        return b"AMQP" + bytes((self.protocol_id, self.major, self.minor, self.revision))


def parse_protocol_header(data: bytes) -> ProtocolHeader:
    """The protocol header of 8 octets; anything that does not start with ``AMQP`` is a FramingError
    (2.2: the receiver then answers with its supported header and closes the socket)."""
    if len(data) != 8 or data[:4] != b"AMQP":
        raise FramingError(f"not an AMQP protocol header: {bytes(data[:8])!r}")
    return ProtocolHeader(data[4], data[5], data[6], data[7])


@dataclass(slots=True)
class Frame:
    """One frame: ``type`` (0 AMQP, 1 SASL), ``channel``, the decoded ``performative`` (None for an empty
    frame) and the ``payload`` octets after it (a transfer's message data; empty for the others)."""

    type: int
    channel: int
    performative: object
    payload: bytes = b""


def encode_frame(performative, channel: int = 0, payload: bytes = b"", frame_type: int = TYPE_AMQP) -> bytes:
    """One frame around ``performative`` (None: an empty frame) and ``payload``; DOFF 2 (no extended
    header).  The caller splits transfers to fit the peer's max-frame-size (2.6.14)."""
    body = b"" if performative is None else performative.encode()
    if payload:
        body += payload
    size = HEADER_SIZE + len(body)
    if size > 0xFFFFFFFF:
        raise ValueError(f"frame of {size} octets does not fit SIZE")
    return _HEADER.pack(size, 2, frame_type, channel) + body


def encode_frame_raw(body: bytes, channel: int = 0, frame_type: int = TYPE_AMQP) -> bytes:
    """A frame around already-encoded body octets (performative + payload)."""
    return _HEADER.pack(HEADER_SIZE + len(body), 2, frame_type, channel) + body


def decode_body(frame_type: int, channel: int, body, budget: list[int] | None = None) -> Frame:
    """The frame of a ``body`` (the octets after the extended header): performative and payload.

    ``budget``: zero-width array elements left (:func:`.types.decode_value`)."""
    if not body:
        if frame_type == TYPE_SASL:
            raise DecodeError("an empty SASL frame (5.3.1: an irrecoverable error)")
        return Frame(frame_type, channel, None)
    provides = "frame" if frame_type == TYPE_AMQP else "sasl-frame"
    performative, end = p.decode_described(body, 0, len(body), provides, budget)
    payload = bytes(body[end:])
    if payload and (frame_type == TYPE_SASL or not isinstance(performative, p.Transfer)):
        raise DecodeError(f"{len(payload)} octets after the {performative.NAME} performative")
    return Frame(frame_type, 0 if frame_type == TYPE_SASL else channel, performative, payload)


class FrameReader:
    """Incremental frame parser: ``feed()`` octets, get back complete frames.

    ``max_frame_size`` is the largest frame accepted (2.7.1 max-frame-size, as this side announced it in
    its open; :data:`MIN_MAX_FRAME_SIZE` until then, and always for SASL frames, 5.3.1).  A frame header
    declaring more is a FramingError before any of its body is buffered, so the reader never holds more
    than one frame of that size.  After an error the reader stays failed (the connection is closed).
    All frames decoded by one ``feed()`` share one budget of zero-width array elements
    (:data:`.types.MAX_ZERO_WIDTH_ELEMENTS`): no client sends such arrays, and a per-frame budget would
    let many tiny frames multiply it.  Each frame's performative has its own element budget
    (``max_elements``, :func:`.types.new_budget`): a larger frame is a DecodeError before its lists are
    built, so no frame holds the event loop for long (the transfer payload, the message, is not decoded
    here).
    The protocol headers are not frames: the front end reads them before it feeds the reader.
    """

    def __init__(self, max_frame_size: int = MIN_MAX_FRAME_SIZE, max_elements: int = FRAME_ELEMENTS) -> None:
        self.max_frame_size = max_frame_size
        self.max_elements = max_elements
        self._buf = bytearray()
        self._failed = False

    @property
    def buffered(self) -> int:
        """Octets held for a frame not yet complete."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        return list(self.frames(data))

    def frames(self, data: bytes, discard: Container[int] = ()) -> Iterator[Frame]:
        """The complete frames after ``data``, each decoded only when the caller takes it (so that what
        the caller does with one frame -- end a session -- applies to the next).

        ``discard``: channels whose frames are dropped unread but for an end or a close (2.5.4/2.5.5
        DISCARDING: a session that sent an end with an error discards incoming frames until the peer's
        end; :data:`ALL_CHANNELS` after a close, 2.4.6 CLOSE_SENT / DISCARDING); only the performative's
        descriptor is looked at."""
        if self._failed:
            return
        buf = self._buf
        buf += data
        pos = 0
        # One zero-width element budget for all the frames of this call: thousands of tiny frames each
        # holding an array of 1,024 empty lists would otherwise turn 64 KB read into hundreds of MB.
        budget = new_budget()
        try:
            while len(buf) - pos >= HEADER_SIZE:
                size, doff, frame_type, channel = _HEADER.unpack_from(buf, pos)
                if size < HEADER_SIZE:
                    raise FramingError(f"frame size {size} is smaller than the frame header (2.3.1)")
                if doff < 2:
                    raise FramingError(f"data offset {doff} is less than 2 (2.3.1)")
                if doff * 4 > size:
                    raise FramingError(f"data offset {doff * 4} lies beyond the frame's {size} octets")
                limit = MIN_MAX_FRAME_SIZE if frame_type == TYPE_SASL else self.max_frame_size
                if size > limit:
                    raise FramingError(f"frame of {size} octets exceeds the maximum frame size {limit}")
                if frame_type not in (TYPE_AMQP, TYPE_SASL):
                    raise FramingError(f"unknown frame type {frame_type:#04x}")
                if len(buf) - pos < size:
                    break
                start, pos = pos + doff * 4, pos + size
                if discard and channel in discard and not _ends(buf, start, pos):
                    continue
                budget[1] = self.max_elements
                yield decode_body(frame_type, channel, bytes(buf[start:pos]), budget)
        except (FramingError, DecodeError):
            self._failed = True
            self._buf = bytearray()
            raise
        finally:
            if pos and not self._failed:
                del buf[:pos]


class _AllChannels:
    """Every channel: ``FrameReader.frames(data, ALL_CHANNELS)`` keeps only ends and closes."""

    def __contains__(self, channel: object) -> bool:
        return True

    def __bool__(self) -> bool:
        return True


ALL_CHANNELS = _AllChannels()
_ENDING_CODES = (0x17, 0x18)  # the end and close performatives' descriptor codes (2.7.8, 2.7.9)
_ENDING_SYMBOLS = (b"amqp:end:list", b"amqp:close:list")


def _ends(buf: bytearray, start: int, stop: int) -> bool:
    """Whether the frame body ``buf[start:stop]`` is an end or a close, from its descriptor alone
    (smallulong, ulong or symbol, 1.2): nothing else of the frame is read."""
    if stop - start < 3 or buf[start] != 0x00:
        return False
    code = buf[start + 1]
    if code == 0x53:
        return buf[start + 2] in _ENDING_CODES
    if code == 0x80:
        return stop - start >= 10 and int.from_bytes(buf[start + 2:start + 10], "big") in _ENDING_CODES
    if code == 0xA3:  # sym8
        size, at = buf[start + 2], start + 3
    elif code == 0xB3:  # sym32
        size, at = int.from_bytes(buf[start + 2:start + 6], "big"), start + 6
    else:
        return False
    return size <= 16 and bytes(buf[at:at + size]) in _ENDING_SYMBOLS
