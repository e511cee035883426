"""A stand-in for the asyncio transport under an in-process connection (unit tests, bench/ingress.py)."""

from __future__ import annotations


class RecordingTransport:
    """The parts of an asyncio transport a front-end connection uses; what it writes is kept, in
    order, and sent nowhere."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += data

    def get_extra_info(self, name: str, default=None):
        return ("127.0.0.1", 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # everything written is kept at once: the buffer never fills, pause_writing never comes

    def get_write_buffer_size(self) -> int:
        return 0
