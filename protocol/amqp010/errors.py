"""AMQP 0-10 codec errors.

0-10's connection.close has few codes (200 normal, 320 connection-forced, 402 invalid-path,
501 framing-error); anything the codec cannot decode, frames or the controls and commands inside
them, is a framing error and closes the connection with 501.
"""

from __future__ import annotations


class Amqp010Error(Exception):
    """A protocol error; ``close_code`` is the connection.close code to answer it with."""

    close_code = 501

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class FramingError(Amqp010Error):
    """Malformed frames or segments, oversize frames, undecodable controls or commands: close-code 501."""

    close_code = 501
