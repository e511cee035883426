"""Every kind of endpoint the broker registers has every method the broker calls on it.

node/broker.py's ``Endpoint`` lists what the broker calls on everything registered (one ``on_*`` per
output kind of store/core/commands.py, ``flush``, ``set_blocked``, ``resume_flow``) and
``ClientEndpoint`` what it asks of clients' connections.  The connection modules assign their class
to these Protocols under ``TYPE_CHECKING`` for mypy, but ``make test`` type-checks node/core only: this
test holds the same line at run time, from the Protocols themselves, so a method added to them
without its implementations fails here (the broker called three methods the Protocol lacked, and
0-9-1 connections lacked two of them: issue 33).
"""

from __future__ import annotations

import inspect

import pytest

from raftmq.node.amqp010.connection import Amqp010Connection
from raftmq.node.amqp091.connection import Amqp091Connection
from raftmq.node.amqp10.connection import Amqp10Connection
from raftmq.node.broker import ClientEndpoint, Endpoint
from raftmq.ops.control import AdminEndpoint


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    """The protocol's own methods (not object's or Protocol's), with their signatures."""
    return {name: inspect.signature(member) for name, member in vars(protocol).items()
            if inspect.isfunction(member) and not name.startswith("_")}


def test_the_protocols_list_what_the_broker_calls():
    """The methods node/broker.py calls on an endpoint: _on_outputs per output kind, _on_throttle
    (resume_flow), check_alarms (set_blocked); and, looked up with getattr on clients' connections,
    close_all/node/server.py (close_connection), the alarm loop (drop_if_peer_gone), memory_held."""
    assert set(_methods(Endpoint)) == {"on_reply", "on_deliver", "on_cancel", "on_transfer",
                                       "on_session_detached", "on_forced_close", "flush", "set_blocked",
                                       "resume_flow"}
    assert set(_methods(ClientEndpoint)) == {"close_connection", "drop_if_peer_gone", "held_bytes"}


@pytest.mark.parametrize(("cls", "protocols"), [
    (Amqp091Connection, (Endpoint, ClientEndpoint)),
    (Amqp010Connection, (Endpoint, ClientEndpoint)),
    (Amqp10Connection, (Endpoint, ClientEndpoint)),
    (AdminEndpoint, (Endpoint,)),
], ids=lambda value: getattr(value, "__name__", ""))
def test_each_endpoint_accepts_every_call(cls, protocols):
    """Each method exists and takes the positional arguments the Protocol's signature gives it."""
    for protocol in protocols:
        for name, signature in _methods(protocol).items():
            method = getattr(cls, name, None)
            assert callable(method), f"{cls.__name__} has no {name}"
            arguments = [object() for p in signature.parameters.values()
                         if p.name != "self" and p.default is inspect.Parameter.empty]
            inspect.signature(method).bind(object(), *arguments)  # TypeError: it cannot take the call
