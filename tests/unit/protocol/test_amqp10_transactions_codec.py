"""The part-4 composites (4.5.1-4.5.6) against a real client library: python-qpid-proton 0.40.

Proton's transaction API writes declare and discharge as described lists with *symbolic* descriptors
(``amqp:declare:list``) inside an amqp-value section, and reads our declared / transactional-state
dispositions by their numeric codes (0x33, 0x34); both must agree with :mod:`.spec_table`.
"""

from __future__ import annotations

import pytest

from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10 import types as t

proton = pytest.importorskip("proton")


def _message_body(body) -> bytes:
    """The sections proton writes for a message with ``body`` (an amqp-value)."""
    return proton.Message(body=body).encode()


def _inner(sections: bytes):
    value = next(s for s in p.decode_sections(sections) if isinstance(s, p.AmqpValue)).value
    return p.from_described(value)


def test_proton_declare_and_discharge_decode_as_ours():
    """4.5.2/4.5.3, as proton.reactor.Transaction sends them (symbolic descriptors, 1.5)."""
    declare = _inner(_message_body(proton.Described(proton.symbol("amqp:declare:list"), [None])))
    assert declare == p.Declare()
    discharge = _inner(_message_body(proton.Described(proton.symbol("amqp:discharge:list"), [b"txn-7", True])))
    assert isinstance(discharge, p.Discharge) and discharge.txn_id == b"txn-7" and discharge.fail is True


def test_ours_decode_in_proton():
    """4.5.5 declared and 4.5.6 transactional-state(txn, rejected(error)), as proton's Data reads them."""
    data = proton.Data()
    data.decode(p.Declared(txn_id=b"txn-1").encode())
    data.rewind()
    data.next()
    declared = data.get_object()
    assert declared.descriptor == 0x33 and bytes(declared.value[0]) == b"txn-1"
    state = p.TransactionalState(txn_id=b"t", outcome=p.Rejected(error=p.Error(
        condition=t.Symbol("amqp:transaction:rollback"))))
    data = proton.Data()
    data.decode(state.encode())
    data.rewind()
    data.next()
    got = data.get_object()
    assert got.descriptor == 0x34 and bytes(got.value[0]) == b"t"
    assert got.value[1].descriptor == 0x25 and got.value[1].value[0].value[0] == "amqp:transaction:rollback"


def test_coordinator_target_and_capabilities():
    """4.5.1 coordinator (provides target) with 4.5.7 txn-capability symbols; 4.5.8 conditions known."""
    coordinator = p.Coordinator(capabilities=["amqp:local-transactions", "amqp:multi-txns-per-ssn"])
    decoded, _ = p.decode_described(coordinator.encode())
    assert decoded == coordinator and "target" in p.Coordinator.PROVIDES
    assert p.CHOICES["txn-capability"]["distributed-transactions"] == "amqp:distributed-transactions"
    assert p.CONDITIONS["unknown-id"] == "amqp:transaction:unknown-id"
    assert p.CONDITIONS["transaction-rollback"] == "amqp:transaction:rollback"
