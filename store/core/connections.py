"""Channels and connections opening and closing, flow and QoS, cluster members and node resets.

A concern of the state machine: how the concerns meet is in store/core/machine.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .commands import (
    OUT_CLOSE,
    ChannelClose,
    ChannelOpen,
    ConnectionClose,
    Flow,
    MemberRemove,
    MemberSet,
    NodeReset,
    OutClose,
    Qos,
)
from .errors import CommandError
from .model import ChannelState

if TYPE_CHECKING:
    from .machine import StateMachine



class Connections:
    def __init__(self, machine: StateMachine) -> None:
        self.m = machine

    def channel_open(self, cmd: ChannelOpen) -> None:
        m = self.m
        conn, number = cmd.conn, cmd.channel
        channels = m.channels.setdefault(conn, {})
        if number in channels:
            raise CommandError(504, f"channel {number} already open")
        channels[number] = ChannelState(conn, number)

    def channel_close(self, cmd: ChannelClose) -> None:
        self.close_channel(cmd.conn, cmd.channel)

    def close_channel(self, conn: str, number: int, error: bool = False) -> None:
        m = self.m
        channels = m.channels.get(conn)
        ch = channels.get(number) if channels else None
        if channels is None or ch is None:
            return
        if ch.session is not None:
            if error:
                m.session_commands.destroy_session(ch.session)
            else:
                m.session_commands.detach(ch.session)
            return
        del channels[number]
        for consumer in list(ch.consumers.values()):
            m.delivery.remove_consumer(consumer)
        m.delivery.requeue_all(ch)

    def connection_close(self, cmd: ConnectionClose) -> None:
        m = self.m
        conn = cmd.conn
        for number in list(m.channels.get(conn, {})):
            self.close_channel(conn, number)
        m.channels.pop(conn, None)
        for queue in list(m.exclusive_queues.pop(conn, {}).values()):
            m.topology.delete_queue(queue)

    def node_reset(self, cmd: NodeReset) -> int:
        """Close every connection of node ``node_id`` not of its boot ``keep_boot``.

        Issued when a node is declared down (``keep_boot`` None) and when a node restarts: its
        consumers' unacknowledged messages go back to their queues (redelivered) and its exclusive
        queues are deleted, as if each client connection had closed.
        """
        m = self.m
        node_id, keep_boot = cmd.node_id, cmd.keep_boot
        prefix = f"{node_id}."
        keep = f"{keep_boot}." if keep_boot else None
        conns = [c for c in dict.fromkeys([*m.channels, *m.exclusive_queues])
                 if c.startswith(prefix) and not (keep and c.startswith(keep))]
        if keep:
            # The node restarted: its earlier incarnations are dead and will never retry a batch.
            for origin in [o for o in m.applied_batches if o.startswith(prefix) and o != keep_boot]:
                del m.applied_batches[origin]
        for conn in conns:
            self.connection_close(ConnectionClose(conn, None))
            m._out.append(OutClose(conn, OUT_CLOSE, 320, f"CONNECTION_FORCED - node {node_id} left the cluster"))
        return len(conns)

    def member_set(self, cmd: MemberSet) -> None:
        m = self.m
        node_id, raft, amqp = cmd.node_id, cmd.raft, cmd.amqp
        if m.members.get(node_id) != (raft, amqp):
            m.members[node_id] = (raft, amqp)
            m.topology.failover_update()  # failover_exchange_behavior 2: the candidates changed

    def member_remove(self, cmd: MemberRemove) -> None:
        m = self.m
        node_id = cmd.node_id
        if m.members.pop(node_id, None) is not None:
            self.node_reset(NodeReset(None, None, node_id, None))
            m.topology.failover_update()

    def qos(self, cmd: Qos) -> None:
        m = self.m
        conn, number, prefetch_count, global_ = cmd.conn, cmd.channel, cmd.prefetch_count, cmd.global_
        ch = m.channel(conn, number)
        if global_:
            ch.prefetch_count = prefetch_count
        else:
            ch.consumer_prefetch = prefetch_count
        for consumer in ch.consumers.values():
            m._dirty[consumer.queue.qid] = consumer.queue

    def flow(self, cmd: Flow) -> bool:
        m = self.m
        conn, number, active = cmd.conn, cmd.channel, cmd.active
        ch = m.channel(conn, number)
        ch.active = bool(active)
        if active:
            for consumer in ch.consumers.values():
                m._dirty[consumer.queue.qid] = consumer.queue
        return ch.active
