"""Frame layer of AMQP 0-9-1 (general spec 4.2.3): type, channel, size, payload, frame-end 0xCE."""

from __future__ import annotations

from struct import Struct
from typing import NamedTuple

from .constants import (
    BASIC_CLASS_ID,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD,
    FRAME_TYPES,
)
from .errors import FrameError
from .methods import Method, _shortstr

_FRAME_HEADER = Struct(">BHI")
_CONTENT_HEADER = Struct(">HHQ")


class Frame(NamedTuple):
    type: int
    channel: int
    payload: bytes


#: Not a frame type on the wire: the item ``FrameReader(whole_publishes=True)`` yields for a
#: basic.publish whose content header and single body frame came in the same read.
FRAME_PUBLISH = -1
_PUBLISH_IDS = b"\x00\x3c\x00\x28"  # class 60, method 40


class WholePublish(NamedTuple):
    """basic.publish (0-9-1 reference 1.8.3.7) + content header + one body frame, parsed at once.

    ``source`` and ``offset`` locate the three frames in the read, so that a front end that cannot
    take the publish as a whole (channel state, flags) hands them to its frame-by-frame path
    (:func:`frames_at`) and answers exactly as it would have.
    """

    type: int  # FRAME_PUBLISH
    channel: int
    exchange: str
    routing_key: str
    bits: int  # mandatory 1, immediate 2
    properties: bytes
    body: bytes
    source: bytes
    offset: int


HEARTBEAT_FRAME = _FRAME_HEADER.pack(FRAME_HEARTBEAT, 0, 0) + b"\xce"


class FrameReader:
    """Incremental frame parser: ``feed()`` bytes as they arrive, get back the complete frames.

    ``frame_max`` is the negotiated maximum frame size (including the 8 bytes of overhead); a frame
    announcing more is a 501 FRAME_ERROR before its payload is even buffered, so a peer cannot make
    the node allocate more than one frame's worth of memory.  Before tuning, the limit is
    ``FRAME_MIN_SIZE`` (general spec: peers must accept frames up to frame-min-size before tune-ok).

    With ``whole_publishes``, a publish that arrives whole (method, header, one body frame, all
    well formed) comes out as one :class:`WholePublish` instead of three frames: a publisher's
    reads are mostly that, and the server's front end then takes each in one step.  Anything
    irregular comes out as plain frames, for the front end's general path to judge.
    """

    __slots__ = ("frame_max", "whole_publishes", "_buf", "_failed")

    def __init__(self, frame_max: int = FRAME_MIN_SIZE, whole_publishes: bool = False) -> None:
        self.frame_max = frame_max
        self.whole_publishes = whole_publishes
        self._buf = bytearray()
        self._failed = False

    def feed(self, data: bytes) -> list[Frame | WholePublish]:
        if self._failed:
            return []
        if data.__class__ is not bytes:  # payloads must be bytes (hashable, immutable) whatever came in
            data = bytes(data)
        buf = self._buf
        if buf:
            buf += data
            if not self._complete_frame_in(buf):
                return []  # still inside one frame: wait for more (each byte is kept once)
            data = bytes(buf)
            self._buf = bytearray()
        try:
            frames, pos = self._split(data)
        except FrameError:
            self._failed = True
            self._buf = bytearray()
            raise
        if pos < len(data):
            self._buf = bytearray(data[pos:])
        return frames

    def _complete_frame_in(self, buf: bytearray) -> bool:
        """Whether ``buf`` holds one whole frame (or a header that must be refused at once)."""
        if len(buf) < 7:
            return False
        ftype, _channel, size = _FRAME_HEADER.unpack_from(buf, 0)
        return ftype not in FRAME_TYPES or size > self._limit() or len(buf) > 7 + size

    def _limit(self) -> int:
        return self.frame_max - FRAME_OVERHEAD if self.frame_max else 0xFFFFFFFF

    def _split(self, data: bytes) -> tuple[list[Frame | WholePublish], int]:
        """The complete frames at the start of ``data`` and the offset after the last one.

        ``data`` is immutable, so a payload is one slice of it (a single copy), and frames are
        built with ``tuple.__new__``: this loop runs for every frame a publisher sends.
        """
        frames: list[Frame | WholePublish] = []
        append = frames.append
        new = tuple.__new__
        pos = 0
        end = len(data)
        unpack = _FRAME_HEADER.unpack_from
        limit = self._limit()
        whole_publishes = self.whole_publishes
        while end - pos >= 7:
            ftype, channel, size = unpack(data, pos)
            if ftype not in FRAME_TYPES:
                raise FrameError(f"unknown frame type {ftype}")
            if size > limit:
                raise FrameError(f"frame size {size + FRAME_OVERHEAD} exceeds frame_max {self.frame_max}")
            stop = pos + 7 + size
            if stop >= end:
                break
            if data[stop] != FRAME_END:
                raise FrameError(f"bad frame-end octet {data[stop]:#04x}")
            if whole_publishes and ftype == FRAME_METHOD and data.startswith(_PUBLISH_IDS, pos + 7):
                publish = _whole_publish(data, pos, stop, channel, limit)
                if publish is not None:
                    append(publish[0])
                    pos = publish[1]
                    continue
            append(new(Frame, (ftype, channel, data[pos + 7:stop])))
            pos = stop + 1
        return frames, pos


def _whole_publish(data: bytes, pos: int, stop: int, channel: int,
                   limit: int) -> tuple[WholePublish, int] | None:
    """The publish whose method frame spans ``data[pos:stop + 1]``, with its header and one body
    frame right after it, and the offset after them; None unless all of it is there and well formed
    (the general path then meets the same bytes frame by frame and judges them)."""
    end = len(data)
    unpack = _FRAME_HEADER.unpack_from
    try:
        p = pos + 13  # frame header (7), class and method ids (4), reserved-1 (2)
        size = data[p]
        exchange = str(data[p + 1:p + 1 + size], "utf-8")
        p += 1 + size
        size = data[p]
        routing_key = str(data[p + 1:p + 1 + size], "utf-8")
        p += 1 + size
        bits = data[p]
    except (IndexError, UnicodeDecodeError):
        return None
    if p >= stop:  # the fields ran past the method frame's payload
        return None
    header = stop + 1
    if end - header < 7:
        return None
    htype, hchannel, hsize = unpack(data, header)
    hstop = header + 7 + hsize
    if (htype != FRAME_HEADER or hchannel != channel or hsize > limit or hsize < 14 or hstop >= end
            or data[hstop] != FRAME_END):
        return None
    class_id, _weight, body_size = _CONTENT_HEADER.unpack_from(data, header + 7)
    body = hstop + 1
    if end - body < 7:
        return None
    btype, bchannel, bsize = unpack(data, body)
    bstop = body + 7 + bsize
    if (btype != FRAME_BODY or bchannel != channel or bsize > limit or bstop >= end or data[bstop] != FRAME_END
            or class_id != BASIC_CLASS_ID or body_size != bsize or not bsize):
        return None
    return tuple.__new__(WholePublish, (FRAME_PUBLISH, channel, exchange, routing_key, bits,
                                        data[header + 19:hstop], data[body + 7:bstop], data, pos)), bstop + 1


def frames_at(data: bytes, pos: int, count: int) -> list[Frame]:
    """The ``count`` frames at ``data[pos:]``, already checked whole (a :class:`WholePublish`'s)."""
    frames = []
    for _ in range(count):
        ftype, channel, size = _FRAME_HEADER.unpack_from(data, pos)
        stop = pos + 7 + size
        frames.append(Frame(ftype, channel, data[pos + 7:stop]))
        pos = stop + 1
    return frames


def encode_frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return b"".join((_FRAME_HEADER.pack(ftype, channel, len(payload)), payload, b"\xce"))


def encode_method_frame(channel: int, method: Method) -> bytes:
    payload = method.encode()
    return b"".join((_FRAME_HEADER.pack(FRAME_METHOD, channel, len(payload)), payload, b"\xce"))


def encode_content(channel: int, method: Method, properties: bytes, body: bytes, frame_max: int) -> bytes:
    """A content method with its header frame and body frames, bodies split to fit ``frame_max``."""
    payload = method.encode()
    parts = [_FRAME_HEADER.pack(FRAME_METHOD, channel, len(payload)), payload, b"\xce"]
    _add_content_frames(parts, channel, properties, body, frame_max)
    return b"".join(parts)


def _add_content_frames(parts: list, channel: int, properties: bytes, body: bytes, frame_max: int) -> None:
    """Append the content header frame and the body frames, bodies split to fit ``frame_max``."""
    size = len(body)
    header = _CONTENT_HEADER.pack(BASIC_CLASS_ID, 0, size) + properties
    pack = _FRAME_HEADER.pack
    parts += (pack(FRAME_HEADER, channel, len(header)), header, b"\xce")
    chunk = (frame_max - FRAME_OVERHEAD) if frame_max else size or 1
    if size <= chunk:
        if size:
            parts += (pack(FRAME_BODY, channel, size), body, b"\xce")
    else:
        view = memoryview(body)
        for start in range(0, size, chunk):
            piece = view[start:start + chunk]
            parts += (pack(FRAME_BODY, channel, len(piece)), piece, b"\xce")


_DELIVER_FIXED = Struct(">BHIHH")  # method frame header, then class 60 method 60 (basic.deliver)
_TAG_AND_FLAG = Struct(">QB")
_SHORTSTRS: dict[str, bytes] = {}


def shortstr_cached(value: str) -> bytes:
    """The short-string encoding of an exchange, routing key or consumer tag: deliveries repeat a
    few of them, and encoding each one anew was a visible share of delivering (profiled)."""
    encoded = _SHORTSTRS.get(value)
    if encoded is None:
        if len(_SHORTSTRS) >= 10_000:
            _SHORTSTRS.clear()
        encoded = _SHORTSTRS[value] = _shortstr(value)
    return encoded


def encode_delivery(channel: int, consumer_tag: str, delivery_tag: int, redelivered: bool, exchange: str,
                    routing_key: str, properties: bytes, body: bytes, frame_max: int) -> bytes:
    """basic.deliver with its content: the same bytes as ``encode_content(channel, BasicDeliver(...),
    ...)``, built without a method object (the consumer's hot path)."""
    tail = b"".join((shortstr_cached(consumer_tag), _TAG_AND_FLAG.pack(delivery_tag, 1 if redelivered else 0),
                     shortstr_cached(exchange), shortstr_cached(routing_key)))
    parts = [_DELIVER_FIXED.pack(FRAME_METHOD, channel, 4 + len(tail), BASIC_CLASS_ID, 60), tail, b"\xce"]
    _add_content_frames(parts, channel, properties, body, frame_max)
    return b"".join(parts)
