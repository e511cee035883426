"""Registers every protocol's message property codec with the core (store/core/message.py).

Imported by node/core/__init__.py, so any node, tool or test that uses the broker core has every
codec: a replica that lacked one would read another's messages differently.
"""

from __future__ import annotations

from raftmq.protocol.amqp010.neutral import FORMAT as AMQP010_FORMAT
from raftmq.protocol.amqp010.neutral import transfer_credit
from raftmq.protocol.amqp091.neutral import FORMAT as AMQP091_FORMAT
from raftmq.protocol.amqp10 import filter_view as _filter_view  # noqa: F401  (registers the filter view)
from raftmq.protocol.amqp10.neutral import FORMAT as AMQP100_FORMAT
from raftmq.store.core.message import register
from raftmq.store.core.model import register_transfer_credit

for _format in (AMQP091_FORMAT, AMQP010_FORMAT, AMQP100_FORMAT):
    register(_format)
register_transfer_credit(transfer_credit)  # 0-10 byte credit counts the header the front end sends
