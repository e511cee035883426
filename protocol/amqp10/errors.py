"""AMQP 1.0 codec errors, each carrying the spec's error condition (2.8.15, 2.8.16).

The front end answers them by closing the connection with an ``error`` whose ``condition`` is the
exception's :attr:`Amqp10Error.condition`: undecodable data is ``amqp:decode-error``, a field whose value
the spec forbids (a mandatory field left null, a value of the wrong type) ``amqp:invalid-field``, and a
frame header that cannot be parsed or a frame larger than the agreed maximum
``amqp:connection:framing-error``.
"""

from __future__ import annotations


class Amqp10Error(Exception):
    """A protocol error; ``condition`` is the symbolic error condition to close the connection with."""

    condition = "amqp:internal-error"

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class DecodeError(Amqp10Error):
    """Data could not be decoded (2.8.15 amqp:decode-error): truncated, unknown codes, broken bounds."""

    condition = "amqp:decode-error"


class InvalidField(DecodeError):
    """A decodable composite whose field breaks its definition (2.8.15 amqp:invalid-field)."""

    condition = "amqp:invalid-field"


class FramingError(Amqp10Error):
    """A valid frame header cannot be formed (2.8.16 amqp:connection:framing-error), or a frame exceeds
    the agreed max-frame-size (2.7.1: "A peer that receives an oversized frame MUST close the connection
    with the framing-error error-code")."""

    condition = "amqp:connection:framing-error"
