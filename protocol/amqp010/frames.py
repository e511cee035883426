"""AMQP 0-10 framing (spec 4.4): frames -> segments -> assemblies, and back.

A frame is a 12-octet header plus payload::

    0 | vv00 BEbe | type | size (uint16, header included) |
    4 | 0000 0000 | 0000 track | channel (uint16)          |
    8 | 0000 0000 | 0000 0000  | 0000 0000 | 0000 0000     |

B/E mark the first/last segment of an assembly, b/e the first/last frame of a segment, ``type`` the
segment type (0 control, 1 command, 2 header, 3 body). One control or command is one assembly;
frames of one (channel, track) arrive in order, and frames of different tracks may interleave
(controls on track 0 between the frames of a command on track 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from struct import Struct

from .errors import FramingError

PROTOCOL_HEADER = b"AMQP\x01\x01\x00\x0a"
HEADER_SIZE = 12
MAX_FRAME_SIZE = 0xFFFF

SEG_CONTROL, SEG_COMMAND, SEG_HEADER, SEG_BODY = 0, 1, 2, 3
TRACK_CONTROL, TRACK_COMMAND = 0, 1

FIRST_SEG, LAST_SEG, FIRST_FRAME, LAST_FRAME = 0x08, 0x04, 0x02, 0x01

_HEADER = Struct(">BBHxBH4x")


@dataclass(slots=True)
class Assembly:
    """One control or command: its segments in order as (segment type, payload)."""

    channel: int
    track: int
    segments: list[tuple[int, bytes]] = field(default_factory=list)


class _Partial:
    __slots__ = ("segments", "seg_type", "parts", "charged")

    def __init__(self) -> None:
        self.segments: list[tuple[int, bytes]] = []
        self.seg_type: int | None = None  # the segment in progress, if any
        self.parts: list[bytes] = []
        self.charged = 0  # octets of frames (headers included) counted in FrameReader.pending_bytes


class FrameReader:
    """Incremental 0-10 frame parser: ``feed()`` bytes, get back complete assemblies.

    ``max_frame_size`` is the negotiated limit (connection.tune max-frame-size); a larger frame is a
    framing error before its payload is buffered.  ``max_assembly_size`` bounds one unfinished
    assembly; ``max_pending_bytes`` bounds all unfinished assemblies of the connection together
    (every (channel, track) may have one in progress), counted as the frames that carry them,
    headers included: a connection can never hold more than that plus one frame.  The front end
    sets it small until the connection is open (issue 17: a client that never authenticated held
    300 MB in unfinished assemblies on many channels).
    """

    def __init__(self, max_frame_size: int = MAX_FRAME_SIZE, max_assembly_size: int = 256 * 1024 * 1024,
                 max_pending_bytes: int | None = None) -> None:
        self.max_frame_size = max_frame_size
        self.max_assembly_size = max_assembly_size
        self.max_pending_bytes = max_assembly_size if max_pending_bytes is None else max_pending_bytes
        self._buf = bytearray()
        self._partial: dict[tuple[int, int], _Partial] = {}
        self._sizes: dict[tuple[int, int], int] = {}
        self.pending_bytes = 0  # frames (headers included) of the unfinished assemblies
        self._failed = False

    def feed(self, data: bytes) -> list[Assembly]:
        if self._failed:
            return []
        buf = self._buf
        buf += data
        out: list[Assembly] = []
        pos = 0
        try:
            while len(buf) - pos >= HEADER_SIZE:
                flags, seg_type, size, track, channel = _HEADER.unpack_from(buf, pos)
                if flags & 0xF0 or buf[pos + 4] or track & 0xF0 or any(buf[pos + 8:pos + 12]):
                    raise FramingError("reserved frame header bits set or unknown frame format version")
                if size < HEADER_SIZE:
                    raise FramingError(f"frame size {size} smaller than the frame header")
                if size > self.max_frame_size:
                    raise FramingError(f"frame size {size} exceeds the negotiated maximum {self.max_frame_size}")
                if seg_type > SEG_BODY:
                    raise FramingError(f"unknown segment type {seg_type}")
                if len(buf) - pos < size:
                    break
                payload = bytes(buf[pos + HEADER_SIZE:pos + size])
                pos += size
                self.pending_bytes += size
                if self.pending_bytes > self.max_pending_bytes:
                    raise FramingError(f"unfinished assemblies hold more than {self.max_pending_bytes} octets")
                assembly = self._frame(flags, seg_type, track, channel, payload, size)
                if assembly is not None:
                    out.append(assembly)
        except FramingError:
            self._failed = True
            self._buf = bytearray()
            raise
        if pos:
            del buf[:pos]
        return out

    def _frame(self, flags: int, seg_type: int, track: int, channel: int, payload: bytes,
               size: int) -> Assembly | None:
        key = (channel, track)
        partial = self._partial.get(key)
        if flags & FIRST_FRAME:
            if partial is not None and partial.seg_type is not None:
                raise FramingError("a new segment began before the previous one ended")
            if flags & FIRST_SEG:
                if partial is not None:
                    raise FramingError("a new assembly began before the previous one ended")
                partial = self._partial[key] = _Partial()
                self._sizes[key] = 0
            elif partial is None:
                raise FramingError("a segment continues an assembly that never began")
            partial.seg_type = seg_type
            partial.parts = []
        elif partial is None or partial.seg_type is None:
            raise FramingError("a frame continues a segment that never began")
        elif seg_type != partial.seg_type:
            raise FramingError("segment type changed within a segment")
        partial.parts.append(payload)
        partial.charged += size
        self._sizes[key] += len(payload)
        if self._sizes[key] > self.max_assembly_size:
            raise FramingError("assembly larger than the maximum message size")
        if not flags & LAST_FRAME:
            return None
        partial.segments.append((partial.seg_type, b"".join(partial.parts)))
        partial.seg_type = None
        partial.parts = []
        if not flags & LAST_SEG:
            return None
        del self._partial[key]
        del self._sizes[key]
        self.pending_bytes -= partial.charged
        return Assembly(channel, track, partial.segments)


def encode_assembly(channel: int, track: int, segments: list[tuple[int, bytes]],
                    max_frame_size: int = MAX_FRAME_SIZE) -> bytes:
    """Frames for one assembly, each segment split to fit ``max_frame_size``."""
    chunk = max_frame_size - HEADER_SIZE
    out: list[bytes] = []
    last_seg = len(segments) - 1
    for i, (seg_type, payload) in enumerate(segments):
        seg_flags = (FIRST_SEG if i == 0 else 0) | (LAST_SEG if i == last_seg else 0)
        size = len(payload)
        starts = range(0, size, chunk) if size else (0,)
        last_start = starts[-1]
        for start in starts:
            piece = payload[start:start + chunk]
            flags = seg_flags | (FIRST_FRAME if start == 0 else 0) | (LAST_FRAME if start == last_start else 0)
            out.append(_HEADER.pack(flags, seg_type, HEADER_SIZE + len(piece), track, channel))
            out.append(piece)
    return b"".join(out)
