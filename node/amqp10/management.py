"""The ``/management`` node of RabbitMQ 4 ("HTTP over AMQP" v2): declare and delete queues, exchanges
and bindings with AMQP 1.0 messages, as RabbitMQ 4's client libraries do.

A client attaches a pair of links to ``/management`` (a sender and a receiver, link property
``paired``).  Each request is a message with ``message-id``, ``to`` = a path, ``subject`` = an HTTP
method, ``reply-to`` ``$me`` and an amqp-value body; the response goes back on the paired receiver
with ``correlation-id`` = the request's id and ``subject`` = the HTTP status code:

=========================================  ============================  =========================
request                                    core command                  status
=========================================  ============================  =========================
PUT /queues/:q {durable, exclusive, ...}    QUEUE_DECLARE                 201 created, 200 existed
GET /queues/:q                             QUEUE_QUERY                   200 {name, durable, ...}
DELETE /queues/:q                          QUEUE_DELETE                  200 {message_count}
DELETE /queues/:q/messages                 QUEUE_PURGE                   200 {message_count}
PUT /exchanges/:x {type, durable, ...}      EXCHANGE_DECLARE              204
DELETE /exchanges/:x                       EXCHANGE_DELETE               204
POST /bindings {source, binding_key,        QUEUE_BIND / EXCHANGE_BIND    204
  destination_queue|destination_exchange}
DELETE /bindings/src=;dstq=|dste=;key=;args=  QUEUE_UNBIND / EXCHANGE_UNBIND  204
=========================================  ============================  =========================

A binding delete answers 204 also when the binding, its exchange or its queue is gone, as RabbitMQ 4's
``rabbit_amqp_management`` does (it looks the binding up and removes it only if found): the client's
delete is idempotent, the outcome is the same -- no such binding.  A refusal (403) still is one.

Every command is authorized by ``Access.authorize`` and applied by the core like any other client's;
a refusal is 403, a missing resource 404, an inequivalent declare 409, anything else unparsable 400.
A core refusal destroys the link's core session (as for every link), so the next request gets a new one.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING
from urllib.parse import unquote

from raftmq.protocol.amqp10 import convert
from raftmq.protocol.amqp10 import performatives as p
from raftmq.protocol.amqp10.errors import DecodeError
from raftmq.store.core import queries as Q
from raftmq.store.core.commands import (
    ExchangeBind,
    ExchangeDeclare,
    ExchangeDelete,
    ExchangeUnbind,
    Op,
    QueueBind,
    QueueDeclare,
    QueueDelete,
    QueuePurge,
    QueueQuery,
    QueueUnbind,
)
from raftmq.store.core.queue_args import STREAMS_UNSUPPORTED

from ..core.access import AccessRefused
from .limits import refusals
from .links import SERIAL, Link, _signed
from .session import error

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger(__name__)

ADDRESS = "/management"
STATUS = {403: "403", 404: "404", 405: "409", 406: "409"}
UNBINDS = (Op.QUEUE_UNBIND, Op.EXCHANGE_UNBIND)


def is_management(attach) -> bool:
    terminus = attach.target if not attach.role else attach.source
    return getattr(terminus, "address", None) == ADDRESS


class BadRequest(Exception):
    pass


def _segment(path: str, prefix: str) -> str:
    return unquote(path[len(prefix):])


def translate(method: str, path: str, body, vhost: str) -> tuple[list, object]:
    """The core command for a request (``[op, None, None, None, *args]``) and how to build the answer:
    a status string, or a function of the core's result value returning (status, body)."""
    head = [None, None, None]
    body = body if isinstance(body, dict) else {}
    if path.startswith("/queues/"):
        rest = path[len("/queues/"):]
        if rest.endswith("/messages") and method == "DELETE":
            name = unquote(rest[: -len("/messages")])
            return QueuePurge(*head, vhost, name), lambda n: ("200", {"message_count": n or 0})
        name = unquote(rest)
        if "/" in rest or not name:
            raise BadRequest(f"bad queue path {path}")
        if method == "PUT":
            args = {str(k): v for k, v in (body.get("arguments") or {}).items()}
            return (QueueDeclare(*head, vhost, name, False, bool(body.get("durable", True)),
                     bool(body.get("exclusive", False)), bool(body.get("auto_delete", False)), args), None)
        if method == "GET":
            return QueueQuery(*head, vhost, name), _queue_info(vhost)
        if method == "DELETE":
            return QueueDelete(*head, vhost, name, False, False), lambda n: ("200", {"message_count": n or 0})
    elif path.startswith("/exchanges/"):
        name = _segment(path, "/exchanges/")
        if "/" in path[len("/exchanges/"):] or not name:
            raise BadRequest(f"bad exchange path {path}")
        if method == "PUT":
            args = {str(k): v for k, v in (body.get("arguments") or {}).items()}
            return (ExchangeDeclare(*head, vhost, name, str(body.get("type", "direct")), False,
                     bool(body.get("durable", True)), bool(body.get("auto_delete", False)),
                     bool(body.get("internal", False)), args), "204")
        if method == "DELETE":
            return ExchangeDelete(*head, vhost, name, False), "204"
    elif path == "/bindings" and method == "POST":
        source, key = str(body.get("source", "")), str(body.get("binding_key", ""))
        args = {str(k): v for k, v in (body.get("arguments") or {}).items()}
        if "destination_queue" in body:
            return QueueBind(*head, vhost, str(body["destination_queue"]), source, key, args), "204"
        if "destination_exchange" in body:
            return ExchangeBind(*head, vhost, str(body["destination_exchange"]), source, key, args), "204"
        raise BadRequest("a binding needs destination_queue or destination_exchange")
    elif path.startswith("/bindings/") and method == "DELETE":
        fields = dict(part.split("=", 1) for part in path[len("/bindings/"):].split(";") if "=" in part)
        source, key = unquote(fields.get("src", "")), unquote(fields.get("key", ""))
        if "dstq" in fields:
            return QueueUnbind(*head, vhost, unquote(fields["dstq"]), source, key, {}), "204"
        if "dste" in fields:
            return ExchangeUnbind(*head, vhost, unquote(fields["dste"]), source, key, {}), "204"
        raise BadRequest("a binding path needs dstq or dste")
    raise BadRequest(f"{method} {path} is not supported")


def _queue_info(vhost: str):
    def answer(value):
        if value is None:
            return "404", None
        name, durable, exclusive, auto_delete, arguments, messages, consumers = value
        kind = (arguments or {}).get("x-queue-type", "classic")
        return "200", {"name": name, "vhost": vhost, "durable": durable, "exclusive": exclusive,
                       "auto_delete": auto_delete, "arguments": dict(arguments or {}), "type": kind,
                       "leader": "", "replicas": [], "message_count": messages, "consumer_count": consumers}
    return answer


class ManagementLink(Link):
    """Either end of the pair: requests arrive on the one the client sends on, answers leave on the
    other (the session's sending management link of the same name, ``management_pairs``)."""

    def __init__(self, session: Session, attach) -> None:
        super().__init__(session, attach)
        self.sends = bool(attach.role)  # the client receives: we send answers here
        self.delivery_count = 0
        self.limit: int | None = None
        self.waiting: deque[bytes] = deque()  # answers for a client without credit (bounded: _request)
        self.parts: list[bytes] = []
        self.received = 0  # the client's delivery-count on the request link

    def attach(self):
        a = self.attach_frame
        self._core_attach()
        session = self.session
        if self.sends:
            session.management_out = self  # answers for a request link with no same-named partner
            pairs = getattr(session, "management_pairs", None)
            if pairs is None:
                pairs = session.management_pairs = {}
            pairs[a.name] = self
        reply = p.Attach(name=a.name, handle=self.handle, role=not a.role, snd_settle_mode=a.snd_settle_mode,
                         rcv_settle_mode=0, source=a.source, target=a.target, properties=a.properties,
                         initial_delivery_count=0 if self.sends else None)
        session.send_attach(reply)
        if not self.sends:
            session.send_flow({"handle": self.handle, "delivery_count": 0, "link_credit": 100})
            self.credit = 100
        return self

    def on_flow(self, flow) -> None:
        if self.sends and flow.link_credit is not None:
            base = flow.delivery_count if flow.delivery_count is not None else 0
            self.limit = (base + flow.link_credit) % SERIAL
            self._send_waiting()
            if flow.echo:
                self.session.send_flow({"handle": self.handle, "delivery_count": self.delivery_count,
                                        "link_credit": self._credit()})

    def _credit(self) -> int:
        return max(0, _signed(self.limit - self.delivery_count)) if self.limit is not None else 0

    def _send_waiting(self) -> None:
        while self.waiting and self._credit() > 0 and self.alive:
            self.delivery_count = (self.delivery_count + 1) % SERIAL
            self.conn.management_pending -= 1
            self.session.send_delivery(self, None, True, self.waiting.popleft())

    def release(self) -> None:
        self.conn.management_pending -= len(self.waiting)  # never sent: no longer held
        self.waiting.clear()
        super().release()

    def answer(self, data: bytes) -> None:
        self.waiting.append(data)
        self._send_waiting()

    def on_transfer(self, transfer, payload: bytes) -> None:
        if self.sends:
            return super().on_transfer(transfer, payload)
        self.parts.append(payload)
        if sum(len(x) for x in self.parts) > 1 << 20:
            self.parts = []
            return
        if transfer.more:
            return
        data, self.parts = b"".join(self.parts), []
        self.credit -= 1
        self.received = (self.received + 1) % SERIAL
        if self.credit < 50:
            self.credit = 100
            self.session.send_flow({"handle": self.handle, "link_credit": 100, "delivery_count": self.received})
        self._request(data)

    def _request(self, data: bytes) -> None:
        conn = self.conn
        limit = conn.config.amqp10_management_pending_max
        if conn.management_pending >= limit:
            text = f"{limit} /management replies pending: grant credit on the reply link"
            refusals(conn.broker).refused("management request", conn.peer, text)
            self.session.detach_link(self, error("amqp:resource-limit-exceeded", text))
            return
        conn.management_pending += 1  # until the reply is written or dropped (_respond, _send_waiting)
        try:
            sections = p.decode_sections(data, conn.config.amqp10_max_message_elements)
        except DecodeError:
            conn.management_pending -= 1
            return
        props = next((s for s in sections if s.__class__ is p.Properties), p.Properties())
        body = next((s.value for s in sections if s.__class__ is p.AmqpValue), None)
        request_id = props.message_id
        try:
            command, answer = translate(str(props.subject or ""), str(props.to or ""), body, conn.vhost)
        except BadRequest as exc:
            return self._respond(request_id, "400", str(exc))
        command = command._replace(conn=conn.conn_id, channel=self.core)
        try:
            conn.access.authorize(command)
        except AccessRefused as exc:
            return self._respond(request_id, "403", exc.text)
        existed = None
        if command.op == Op.QUEUE_DECLARE:
            existed = Q.has_queue(conn.broker.machine, conn.vhost, command.name)

        def done(result: tuple) -> None:
            if result[0] != 0:
                conn.links_by_core.pop(self.core, None)
                self._core_attach()  # the refusal destroyed the core session: the next request gets one
                if result[1] == 404 and command.op in UNBINDS:
                    return self._respond(request_id, "204", None)  # no such binding: RabbitMQ 4's 204
                status = "400" if STREAMS_UNSUPPORTED in str(result[2]) else STATUS.get(result[1], "400")
                return self._respond(request_id, status, str(result[2]))
            if answer is None:
                return self._respond(request_id, "200" if existed else "201", None)
            if isinstance(answer, str):
                return self._respond(request_id, answer, None)
            status, value = answer(result[1])
            self._respond(request_id, status, value)
        conn.request(command, done)

    def _respond(self, request_id, status: str, body) -> None:
        """The answer goes out on this pair's other link: the sending link of the same name, as
        RabbitMQ 4 pairs them (two pairs on one session each get their own answers; answering on
        the last pair attached left the first one's client waiting for ever), else the session's
        latest sending link (a client naming its two links differently)."""
        session = self.session
        out = getattr(session, "management_pairs", {}).get(self.name)
        if out is None or not out.alive:
            out = getattr(session, "management_out", None)
        if out is None or not out.alive:
            self.conn.management_pending -= 1  # nowhere to answer: dropped
            return
        sections = [p.Properties(correlation_id=request_id, subject=status), p.AmqpValue(body)]
        out.answer(convert.encode(sections))
