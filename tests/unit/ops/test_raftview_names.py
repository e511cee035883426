"""The Cluster page's leader history names members by node id (ops/http/raftview.py leader_name)."""

from types import SimpleNamespace

from raftmq.ops.http.raftview import leader_name


class _Broker(SimpleNamespace):
    def node_of_raft(self, address: str | None) -> str | None:
        return next((node for node, (raft, _amqp) in self.members.items() if raft == address), None)


def test_a_leader_recorded_by_address_is_named_by_node_id_once_the_members_are_known():
    broker = _Broker(config=SimpleNamespace(node_id="n1"), members={})
    assert leader_name(broker, "127.0.0.1:29261") == "raftmq@127.0.0.1:29261"  # members not applied yet
    broker.members = {"n2": ("127.0.0.1:29261", "127.0.0.1:5673")}
    assert leader_name(broker, "127.0.0.1:29261") == "raftmq@n2"
    assert leader_name(broker, "n2") == "raftmq@n2"  # recorded by node id: unchanged
