"""AMQP 0-9-1 method classes, generated from :data:`.spec_table.METHOD_TABLE`, and their lookup tables.

Each method is a small slotted class (``BasicPublish``, ``ConnectionStartOk``...) with its fields as
typed attributes, class attributes ``CLASS_ID``, ``METHOD_ID``, ``NAME``, ``SYNCHRONOUS``,
``HAS_CONTENT``, an ``encode()`` that returns the method frame payload and a ``decode(buf, offset)``
static method.

The classes are generated source checked in (:mod:`.methods_gen`, written by :mod:`._generate`, the way
pamqp ships its generated ``commands.py``): type checkers and editors see them, and the codecs are the
same straight-line code the table used to be compiled into at import time.  This module re-exports them
and adds the lookup tables and :func:`decode_method`.
"""

from __future__ import annotations

from struct import Struct
from struct import error as StructError

from .errors import AMQPSyntaxError, FrameError, NotImplementedMethod
from .method_base import Method as Method
from .method_base import _longstr as _longstr
from .method_base import _shortstr as _shortstr
from .methods_gen import *  # noqa: F403 - the generated classes are this module's public names
from .methods_gen import METHOD_CLASSES

_IDS = Struct(">HH")

#: (class_id << 16 | method_id) -> method class.
METHODS_BY_INDEX: dict[int, type[Method]] = {cls.CLASS_ID << 16 | cls.METHOD_ID: cls for cls in METHOD_CLASSES}
#: "basic.publish" -> method class.
METHODS_BY_NAME: dict[str, type[Method]] = {cls.NAME: cls for cls in METHOD_CLASSES}


def decode_method(payload: bytes) -> Method:
    """Decode a method frame payload (class id, method id, arguments).

    Unknown class/method -> 540 NOT_IMPLEMENTED; a payload too short for its fields -> 501 FRAME_ERROR;
    a short string that is not UTF-8 -> 502 SYNTAX_ERROR.
    """
    try:
        class_id, method_id = _IDS.unpack_from(payload, 0)
    except StructError as exc:
        raise FrameError("method frame shorter than its class and method ids") from exc
    cls = METHODS_BY_INDEX.get(class_id << 16 | method_id)
    if cls is None:
        raise NotImplementedMethod(f"unknown method {class_id}.{method_id}", class_id, method_id)
    try:
        return cls.decode(payload, 4)
    except (StructError, IndexError) as exc:
        raise FrameError(f"truncated '{cls.NAME}'", class_id, method_id) from exc
    except UnicodeDecodeError as exc:
        raise AMQPSyntaxError(f"'{cls.NAME}' has a short string that is not UTF-8", class_id, method_id) from exc
