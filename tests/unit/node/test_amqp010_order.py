"""A 0-10 session's commands behind a topology change it sent, with queue groups (node/amqp010/session.py
``_hold``; issue 34).

0-10 spec 5.8: "the receiving peer MUST execute each command in order"; execution.sync asks for the
completion of every command before it; a client need not wait between commands.  With groups a
metadata command reaches the queue groups only once the metadata group forwarded it, so a transfer
behind exchange.bind waits for the bind's completion (every group applied it).  The session runs here
against a recording connection: what it submits, and when, is checked.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from raftmq.node.amqp010.session import HELD_MAX, ServerSession
from raftmq.protocol.amqp010 import codec as c
from raftmq.store.core import ranges as rs
from raftmq.store.core.commands import Op


class _Access:
    def authorize(self, command: Any) -> None:
        return None


class _Host:
    def __init__(self, groups: int) -> None:
        self.broker = SimpleNamespace(config=SimpleNamespace(raft_groups=groups))
        self.conn_id, self.principal, self.access, self.vhost = "c", None, _Access(), "/"
        self.counts, self.completion_due = [0, 0], {}
        self.requests: list[tuple[Any, Any, Any]] = []  # (inner command, on_ok, on_error)
        self.sent: list[Any] = []
        self.reads: list[str] = []
        self.transport = SimpleNamespace(pause_reading=lambda: self.reads.append("pause"),
                                         resume_reading=lambda: self.reads.append("resume"))
        self.reading = SimpleNamespace(paused=False)

    def send(self, channel: int, method: Any) -> None:
        self.sent.append(method)

    def submit(self, command: Any, deferrable: bool = False) -> None:
        self.requests.append((command, None, None))

    def request(self, session: Any, command: Any, on_ok: Any, on_error: Any = None, deferrable: bool = False) -> None:
        self.requests.append((command.inner if command.op == Op.SESSION_COMMAND else command, on_ok, on_error))

    def drop_session(self, channel: int) -> None:
        return None

    def ops(self) -> list[int]:
        return [command.op for command, _ok, _err in self.requests]

    def answer(self, op: int, value: Any = None) -> None:
        index = next(i for i, (command, _ok, _err) in enumerate(self.requests) if command.op == op)
        _command, on_ok, _err = self.requests.pop(index)
        on_ok(value)


def attached(groups: int) -> tuple[ServerSession, _Host]:
    host = _Host(groups)
    session = ServerSession(host, 1, b"s")  # type: ignore[arg-type]  # the recording host
    session.attaching, session.attached = False, True
    return session, host


def transfer(body: bytes = b"x") -> c.MessageTransfer:
    return c.MessageTransfer(destination="ex", accept_mode=1, acquire_mode=0,
                             headers=[c.DeliveryProperties(routing_key="k"), c.MessageProperties()], body=body)


def test_groups_transfer_waits_for_the_bind_and_sync_for_the_transfer():
    """exchange.declare and exchange.bind go at once (the metadata group orders them); the transfer
    behind them waits for both completions; an execution.sync after it completes only once the
    transfer is applied."""
    session, host = attached(3)
    session.on_command(c.ExchangeDeclare(exchange="ex", type="direct"))
    session.on_command(c.ExchangeBind(queue="q", exchange="ex", binding_key="k"))
    session.on_command(transfer())
    session.on_command(c.ExecutionSync())
    assert host.ops() == [Op.EXCHANGE_DECLARE, Op.QUEUE_BIND]
    host.answer(Op.EXCHANGE_DECLARE)
    assert host.ops() == [Op.QUEUE_BIND]
    assert not rs.contains(session.completed, 3)  # the sync waits for the held transfer
    host.answer(Op.QUEUE_BIND)
    assert host.ops() == [Op.PUBLISH]
    assert not rs.contains(session.completed, 3)
    host.answer(Op.PUBLISH, 1)
    assert all(rs.contains(session.completed, i) for i in range(4))


def test_groups_redeclare_waits_for_the_delete():
    """queue.delete then queue.declare of the same name: the declare waits for the delete."""
    session, host = attached(3)
    session.on_command(c.QueueDelete(queue="q"))
    session.on_command(c.QueueDeclare(queue="q"))
    assert host.ops() == [Op.QUEUE_DELETE]
    host.answer(Op.QUEUE_DELETE, 0)
    assert host.ops() == [Op.QUEUE_DECLARE]


def test_one_group_nothing_waits():
    """With one group every command goes at once (the one log orders them)."""
    session, host = attached(1)
    session.on_command(c.ExchangeBind(queue="q", exchange="ex", binding_key="k"))
    session.on_command(transfer())
    assert host.ops() == [Op.QUEUE_BIND, Op.PUBLISH]


def test_groups_refused_change_drops_what_is_held():
    """The bind is refused: the session ends with an execution exception, the transfer held behind it
    is never submitted."""
    session, host = attached(3)
    session.on_command(c.ExchangeBind(queue="q", exchange="nope", binding_key="k"))
    session.on_command(transfer())
    index = host.ops().index(Op.QUEUE_BIND)
    _command, _on_ok, on_error = host.requests.pop(index)
    on_error(404, "not-found: no exchange 'nope'")
    assert Op.PUBLISH not in host.ops()
    assert any(isinstance(method, c.ExecutionException) for method in host.sent)
    assert not session.attached


def test_groups_held_transfers_are_bounded():
    """Transfers flooding behind a bind never completed: past HELD_MAX bytes held the connection stops
    reading; the completion releases them all, in order, and reading resumes."""
    session, host = attached(3)
    session.on_command(c.ExchangeBind(queue="q", exchange="ex", binding_key="k"))
    count = HELD_MAX // 4096 + 2
    for i in range(count):
        session.on_command(transfer(b"%06d" % i + b"x" * 4090))
    assert host.ops() == [Op.QUEUE_BIND]
    assert host.reads and set(host.reads) == {"pause"}
    host.answer(Op.QUEUE_BIND)
    published = [command for command, _ok, _err in host.requests if command.op == Op.PUBLISH]
    assert [command.body[:6] for command in published] == [b"%06d" % i for i in range(count)]
    assert host.reads[-1] == "resume"
