"""Refusals: how the state machine says no, with AMQP 0-9-1's reply codes (every front end maps them
to its own protocol's)."""

from __future__ import annotations

REPLY_NAMES = {
    311: "CONTENT_TOO_LARGE",
    312: "NO_ROUTE",
    313: "NO_CONSUMERS",
    320: "CONNECTION_FORCED",
    402: "INVALID_PATH",
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    501: "FRAME_ERROR",
    502: "SYNTAX_ERROR",
    503: "COMMAND_INVALID",
    504: "CHANNEL_ERROR",
    505: "UNEXPECTED_FRAME",
    506: "RESOURCE_ERROR",
    530: "NOT_ALLOWED",
    540: "NOT_IMPLEMENTED",
    541: "INTERNAL_ERROR",
}
HARD_ERRORS = frozenset((320, 402, 501, 502, 503, 504, 505, 506, 530, 540, 541))


class CommandError(Exception):
    """A command refused by the state: becomes an ``(ERR, code, text)`` result."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(code, text)
        self.code = code
        self.text = f"{REPLY_NAMES.get(code, 'ERROR')} - {text}"
