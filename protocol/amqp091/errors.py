"""Codec errors, each carrying the reply code the 0-9-1 spec assigns to it.

They are all connection exceptions: the front end answers them with connection.close.
"""

from __future__ import annotations

from .constants import ReplyCode


class AMQPError(Exception):
    """A protocol error with its reply code and the class/method that caused it (0 when none)."""

    reply_code: int = ReplyCode.INTERNAL_ERROR
    name = "INTERNAL_ERROR"

    def __init__(self, reply_text: str = "", class_id: int = 0, method_id: int = 0,
                 reply_code: int | None = None) -> None:
        if reply_code is not None:
            self.reply_code = reply_code
        self.reply_text = reply_text if reply_text.startswith(self.name) else f"{self.name} - {reply_text}"
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(self.reply_text)


class FrameError(AMQPError):
    """501: a frame that cannot be decoded (bad frame-end, oversize, truncated, unknown type)."""

    reply_code = ReplyCode.FRAME_ERROR
    name = "FRAME_ERROR"


class AMQPSyntaxError(AMQPError):
    """502: a frame whose fields hold illegal values (bad field-table type, invalid UTF-8...)."""

    reply_code = ReplyCode.SYNTAX_ERROR
    name = "SYNTAX_ERROR"


class CommandInvalid(AMQPError):
    """503: a method that is not valid here."""

    reply_code = ReplyCode.COMMAND_INVALID
    name = "COMMAND_INVALID"


class UnexpectedFrame(AMQPError):
    """505: a frame of a type the peer did not expect (content without a content method...)."""

    reply_code = ReplyCode.UNEXPECTED_FRAME
    name = "UNEXPECTED_FRAME"


class NotImplementedMethod(AMQPError):
    """540: a class or method this server does not know."""

    reply_code = ReplyCode.NOT_IMPLEMENTED
    name = "NOT_IMPLEMENTED"
