"""Exceptions a 0-9-1 front end raises while handling a method."""

from __future__ import annotations


class _FrontEndException(Exception):
    def __init__(self, code: int, text: str, class_id: int = 0, method_id: int = 0) -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text
        self.class_id = class_id
        self.method_id = method_id


class ChannelException(_FrontEndException):
    """Closes the channel with channel.close (0-9-1 "soft" errors: 311-406)."""


class ConnectionException(_FrontEndException):
    """Closes the connection with connection.close ("hard" errors: 320, 402, 5xx)."""
