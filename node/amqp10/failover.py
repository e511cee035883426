"""Failover hints in the AMQP 1.0 open (issue 19): where else a client may connect.

* ``failover-server-list`` (the Qpid JMS / ActiveMQ Artemis convention): an open property listing every
  cluster member's client address as a map of ``hostname``, ``network-host``, ``port`` and ``scheme``;
  Qpid JMS's failover transport adds them to its list of peers.
* ``amqp:connection:redirect`` (2.8.16): with ``amqp10_redirect_to_leader``, a follower answers open with
  a close carrying that error, its ``info`` naming the leader (``hostname``, ``network-host``,
  ``port``), so that a client that follows redirects talks to the node that sequences everything.
"""

from __future__ import annotations

from raftmq.protocol.amqp10 import types as t


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def failover_server_list(known_hosts: str) -> list[dict]:
    """The open property's value for the comma-separated ``host:port`` client addresses."""
    servers = []
    for address in (a for a in known_hosts.split(",") if a):
        host, port = _split(address)
        servers.append({t.Symbol("hostname"): host, t.Symbol("network-host"): host, t.Symbol("port"): t.UShort(port),
                        t.Symbol("scheme"): "amqp"})
    return servers


def redirect_info(leader_address: str) -> dict:
    """The ``info`` of an amqp:connection:redirect error pointing at ``leader_address`` (host:port)."""
    host, port = _split(leader_address)
    return {t.Symbol("hostname"): host, t.Symbol("network-host"): host, t.Symbol("port"): t.UShort(port)}
