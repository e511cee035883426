"""node/admission.py: one count of live protocol connections, in total and per source address."""

from __future__ import annotations

from raftmq.node.admission import Admission
from raftmq.node.config import Config


def test_total_limit_refuses_beyond_max_connections_and_frees_on_release():
    adm = Admission(Config(max_connections=2))
    assert adm.admit("10.0.0.1") is None
    assert adm.admit("10.0.0.2") is None
    assert "connection limit reached" in adm.admit("10.0.0.3")
    assert adm.total == 3  # a refused connection is counted while it lives
    adm.release("10.0.0.3")
    adm.release("10.0.0.1")
    assert adm.admit("10.0.0.3") is None
    assert adm.total == 2 and dict(adm.by_address) == {"10.0.0.2": 1, "10.0.0.3": 1}


def test_per_address_limit_is_per_source_address_and_zero_means_none():
    adm = Admission(Config(max_connections_per_address=2))
    assert adm.admit("a") is None and adm.admit("a") is None
    assert "per address" in adm.admit("a")
    assert adm.admit("b") is None
    for _ in range(3):
        adm.release("a")
    assert dict(adm.by_address) == {"b": 1}
    unlimited = Admission(Config(max_connections_per_address=0))
    assert all(unlimited.admit("a") is None for _ in range(1000))
