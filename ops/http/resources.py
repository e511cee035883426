"""Queues, exchanges and bindings: /api/queues, /api/exchanges, /api/bindings (RabbitMQ's paths).

Reads come from this node's copy of the state machine; changes are log commands (ops/control.py)
checked first against the user's vhost permissions with the rules an AMQP client of that user
meets (configure to declare or delete, read to purge or get, write to publish...).
"""

from __future__ import annotations

import asyncio
import base64

from aiohttp import web

from raftmq.node.group_figures import consumer_infos, queue_infos
from raftmq.protocol.amqp091.properties import BasicProperties, encode_properties
from raftmq.store.core import queries as Q
from raftmq.store.core.commands import ROUTED
from raftmq.store.core.message import decode
from raftmq.store.core.model import Message

from .common import (
    access_in,
    bad_request,
    body,
    columns,
    context,
    not_found,
    operator,
    reply,
    require_vhost,
)
from .views import binding_view, by_name, default_binding, exchange_view, properties_key, queue_view


def _visible_vhosts(request: web.Request, vhost: str | None) -> list[str]:
    """The names of the vhosts to list: the one asked for, or every one the operator may see."""
    if vhost is not None:
        require_vhost(request, vhost)
        return [vhost]
    op = operator(request)
    return [v for v in Q.vhost_names(context(request).broker.machine) if op.may_see_vhost(v)]


def _vhost_arg(request: web.Request) -> str | None:
    return request.match_info.get("vhost")  # (aiohttp decodes path parameters once: %2F is "/")


def _name(request: web.Request, key: str = "name") -> str:
    return request.match_info[key]


# ------------------------------------------------------------------ queues

async def list_queues(request: web.Request) -> web.Response:
    ctx = context(request)
    machine = ctx.broker.machine
    queues = [q for v in _visible_vhosts(request, _vhost_arg(request)) for q in sorted(Q.queues(machine, v), key=by_name)]
    queues, figures = await queue_infos(ctx.broker, queues)  # queue groups' queues: their workers' figures
    return columns(request, queues, lambda q: queue_view(ctx.broker, q, ctx.rates, figures.get(q.qid)))


def _queue(request: web.Request) -> tuple[str, Q.QueueInfo]:
    vhost = _vhost_arg(request)
    require_vhost(request, vhost)
    queue = Q.queue(context(request).broker.machine, vhost, _name(request))
    if queue is None:
        raise not_found()
    return vhost, queue


async def get_queue(request: web.Request) -> web.Response:
    vhost, queue = _queue(request)
    ctx = context(request)
    (queue,), figures = await queue_infos(ctx.broker, [queue])  # a queue group's queue: its worker's figures
    view = queue_view(ctx.broker, queue, ctx.rates, figures.get(queue.qid))
    view["consumer_details"] = [_consumer_view(c) for c in await consumer_infos(ctx.broker, vhost, queue.name)]
    return reply(view)


async def put_queue(request: web.Request) -> web.Response:
    """Declare (201 when created, 204 when it existed with the same properties, 400 otherwise)."""
    vhost, name = _vhost_arg(request), _name(request)
    require_vhost(request, vhost, change=True)
    data = await body(request)
    arguments = data.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise bad_request("arguments must be an object")
    existed = Q.has_queue(context(request).broker.machine, vhost, name)
    await context(request).control.declare_queue(vhost, name, _flag(data, "durable", True),
                                                 _flag(data, "auto_delete", False), arguments,
                                                 access=access_in(request, vhost))
    return web.Response(status=204 if existed else 201)


async def delete_queue(request: web.Request) -> web.Response:
    vhost, queue = _queue(request)
    require_vhost(request, vhost, change=True)
    await context(request).control.delete_queue(vhost, queue.name, request.query.get("if-unused") == "true",
                                                request.query.get("if-empty") == "true",
                                                access=access_in(request, vhost))
    return web.Response(status=204)


async def purge_queue(request: web.Request) -> web.Response:
    vhost, queue = _queue(request)
    require_vhost(request, vhost, change=True)
    await context(request).control.purge_queue(vhost, queue.name, access=access_in(request, vhost))
    return web.Response(status=204)


async def get_messages(request: web.Request) -> web.Response:
    """POST .../get {"count", "ackmode", "encoding": auto|base64, "truncate"}: RabbitMQ's fields."""
    vhost, queue = _queue(request)
    require_vhost(request, vhost, change=True)
    data = await body(request)
    try:
        count = int(data.get("count", 1))
    except (TypeError, ValueError):
        raise bad_request("count must be an integer") from None
    ackmode = str(data.get("ackmode", "ack_requeue_true"))
    if "requeue" in data and "ackmode" not in data:  # the pre-3.7 form
        ackmode = "ack_requeue_true" if data["requeue"] in (True, "true") else "ack_requeue_false"
    encoding = str(data.get("encoding", "auto"))
    if encoding not in ("auto", "base64"):
        raise bad_request("encoding must be auto or base64")
    truncate = data.get("truncate")
    # Shielded: a client going away must not cut the get between taking and settling messages.
    fetched = await asyncio.shield(context(request).control.get(vhost, queue.name, max(0, min(count, 10_000)),
                                                                ackmode, access_in(request, vhost)))
    out = []
    for item in fetched:
        message = item.message
        payload_bytes = item.body if truncate is None else item.body[: int(truncate)]
        payload, payload_encoding = _encode_payload(payload_bytes, encoding)
        out.append({
            "payload_bytes": len(item.body),
            "redelivered": item.redelivered,
            "exchange": message.exchange,
            "routing_key": message.routing_key,
            "message_count": item.remaining,
            "properties": _properties_view(message),
            "payload": payload,
            "payload_encoding": payload_encoding,
        })
    return reply(out)


def _encode_payload(payload: bytes, encoding: str) -> tuple[str, str]:
    if encoding == "auto":
        try:
            return payload.decode("utf-8"), "string"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(payload).decode(), "base64"


def _properties_view(message: Message) -> dict:
    """The message's properties as the management API shows them (RabbitMQ's field names),
    whatever protocol published it (store/core/message.py)."""
    try:
        props = decode(message.properties, message.format)
    except (ValueError, LookupError):
        return {}
    out = {}
    for field in props.__slots__:
        value = getattr(props, field)
        if value is not None and value != {}:
            out[field] = value
    return out


# ------------------------------------------------------------------ exchanges

async def list_exchanges(request: web.Request) -> web.Response:
    machine = context(request).broker.machine
    exchanges = [e for v in _visible_vhosts(request, _vhost_arg(request)) for e in sorted(Q.exchanges(machine, v),
                                                                                         key=by_name)]
    return columns(request, exchanges, lambda e: exchange_view(e, plugins=True))


def _exchange(request: web.Request) -> tuple[str, Q.ExchangeInfo]:
    vhost = _vhost_arg(request)
    require_vhost(request, vhost)
    exchange = Q.exchange(context(request).broker.machine, vhost, _exchange_name(request))
    if exchange is None:
        raise not_found()
    return vhost, exchange


def _exchange_name(request: web.Request) -> str:
    name = _name(request)
    return "" if name == "amq.default" else name


async def get_exchange(request: web.Request) -> web.Response:
    _vhost, exchange = _exchange(request)
    view = exchange_view(exchange, plugins=True)
    view["incoming"], view["outgoing"] = [], []
    return reply(view)


async def put_exchange(request: web.Request) -> web.Response:
    vhost, name = _vhost_arg(request), _exchange_name(request)
    require_vhost(request, vhost, change=True)
    data = await body(request)
    if "type" not in data:
        raise bad_request("[{key_missing,type}]")
    existed = Q.has_exchange(context(request).broker.machine, vhost, name)
    await context(request).control.declare_exchange(vhost, name, str(data["type"]), _flag(data, "durable", True),
                                                    _flag(data, "auto_delete", False), _flag(data, "internal", False),
                                                    data.get("arguments") or {}, access=access_in(request, vhost))
    return web.Response(status=204 if existed else 201)


async def delete_exchange(request: web.Request) -> web.Response:
    vhost, exchange = _exchange(request)
    require_vhost(request, vhost, change=True)
    await context(request).control.delete_exchange(vhost, exchange.name, request.query.get("if-unused") == "true",
                                                   access=access_in(request, vhost))
    return web.Response(status=204)


async def publish(request: web.Request) -> web.Response:
    """POST .../publish {"routing_key", "payload", "payload_encoding": string|base64, "properties"}
    -> {"routed": bool}, as RabbitMQ (a message routed to no queue is dropped)."""
    vhost, exchange = _exchange(request)
    require_vhost(request, vhost, change=True)
    data = await body(request)
    for key in ("routing_key", "payload", "payload_encoding", "properties"):
        if key not in data:
            raise bad_request(f"[{{key_missing,{key}}}]")
    payload = data["payload"]
    if data["payload_encoding"] == "base64":
        try:
            payload_bytes = base64.b64decode(payload, validate=True)
        except ValueError:
            raise bad_request("payload is not base64") from None
    elif data["payload_encoding"] == "string":
        payload_bytes = str(payload).encode()
    else:
        raise bad_request("payload_encoding must be string or base64")
    props = _properties(data["properties"] or {})
    expiration = int(props.expiration) if props.expiration and props.expiration.isdigit() else None
    outcome = await context(request).control.publish(
        vhost, exchange.name, str(data["routing_key"]), encode_properties(props), payload_bytes,
        props.delivery_mode == 2, props.priority, expiration, access=access_in(request, vhost))
    return reply({"routed": outcome == ROUTED})


def _properties(data: dict) -> BasicProperties:
    props = BasicProperties()
    for key, value in data.items():
        if key not in BasicProperties.__slots__:
            raise bad_request(f"unknown message property '{key}'")
        if key in ("delivery_mode", "priority", "timestamp"):
            try:
                value = int(value)
            except (TypeError, ValueError):
                raise bad_request(f"{key} must be an integer") from None
        elif key == "headers":
            if not isinstance(value, dict):
                raise bad_request("headers must be an object")
        else:
            value = str(value)
        setattr(props, key, value)
    return props


# ------------------------------------------------------------------ bindings

def _default_bindings(machine, vhost: str) -> list[dict]:
    """The default exchange's implicit binding to each queue of the vhost, by queue name."""
    return [default_binding(vhost, q) for q in sorted(Q.queues(machine, vhost), key=by_name)]


def _bindings_of(machine, vhost: str) -> list[dict]:
    return _default_bindings(machine, vhost) + [binding_view(vhost, b) for b in Q.bindings(machine, vhost)]


async def list_bindings(request: web.Request) -> web.Response:
    machine = context(request).broker.machine
    rows = [row for v in _visible_vhosts(request, _vhost_arg(request)) for row in _bindings_of(machine, v)]
    return columns(request, rows)


def _pair(request: web.Request) -> tuple[str, str, str, bool]:
    """(vhost, source exchange, destination, destination is a queue) from .../e/{source}/{q|e}/{dest}."""
    vhost = _vhost_arg(request)
    require_vhost(request, vhost)
    machine = context(request).broker.machine
    source = _name(request, "source")
    source = "" if source == "amq.default" else source
    to_queue = request.match_info["kind"] == "q"
    destination = _name(request, "destination")
    if not Q.has_exchange(machine, vhost, source):
        raise not_found()
    if not (Q.has_queue if to_queue else Q.has_exchange)(machine, vhost, destination):
        raise not_found()
    return vhost, source, destination, to_queue


def _pair_bindings(request: web.Request, vhost: str, source: str, destination: str, to_queue: bool) -> list[dict]:
    machine = context(request).broker.machine
    if not source:  # the default exchange: its implicit binding to every queue
        queue = Q.queue(machine, vhost, destination) if to_queue else None
        return [default_binding(vhost, queue)] if queue is not None else []
    return [binding_view(vhost, b) for b in Q.bindings(machine, vhost, source)
            if b.destination == destination and b.dest_is_queue == to_queue]


async def list_pair(request: web.Request) -> web.Response:
    vhost, source, destination, to_queue = _pair(request)
    return reply(_pair_bindings(request, vhost, source, destination, to_queue))


async def create_binding(request: web.Request) -> web.Response:
    vhost, source, destination, to_queue = _pair(request)
    require_vhost(request, vhost, change=True)
    data = await body(request)
    routing_key, arguments = str(data.get("routing_key", "")), data.get("arguments") or {}
    await context(request).control.bind(vhost, source, destination, to_queue, routing_key, arguments,
                                        access=access_in(request, vhost))
    location = f"{properties_key(routing_key, arguments)}"
    return web.Response(status=201, headers={"Location": location})


async def get_binding(request: web.Request) -> web.Response:
    vhost, source, destination, to_queue = _pair(request)
    wanted = request.match_info["props"]
    for row in _pair_bindings(request, vhost, source, destination, to_queue):
        if row["properties_key"] == wanted:
            return reply(row)
    raise not_found()


async def delete_binding(request: web.Request) -> web.Response:
    vhost, source, destination, to_queue = _pair(request)
    require_vhost(request, vhost, change=True)
    wanted = request.match_info["props"]
    for row in _pair_bindings(request, vhost, source, destination, to_queue):
        if row["properties_key"] == wanted and source:
            await context(request).control.unbind(vhost, source, destination, to_queue, row["routing_key"],
                                                   row["arguments"], access=access_in(request, vhost))
            return web.Response(status=204)
    raise not_found()


async def queue_bindings(request: web.Request) -> web.Response:
    vhost, queue = _queue(request)
    rows = [default_binding(vhost, queue)]
    rows += [binding_view(vhost, b) for b in Q.bindings(context(request).broker.machine, vhost)
             if b.dest_is_queue and b.destination == queue.name]
    return reply(rows)


async def exchange_bindings(request: web.Request) -> web.Response:
    """.../bindings/source (bindings from this exchange) or .../bindings/destination (to it)."""
    vhost, exchange = _exchange(request)
    machine = context(request).broker.machine
    if request.match_info["side"] == "source":
        if exchange.name == "":
            rows = _default_bindings(machine, vhost)
        else:
            rows = [binding_view(vhost, b) for b in Q.bindings(machine, vhost, exchange.name)]
    else:
        rows = [binding_view(vhost, b) for b in Q.bindings(machine, vhost)
                if not b.dest_is_queue and b.destination == exchange.name]
    return reply(rows)


def _flag(data: dict, key: str, default: bool) -> bool:
    value = data.get(key, default)
    if isinstance(value, str):
        return value.lower() == "true"
    return bool(value)


# ------------------------------------------------------------------ consumers

def _consumer_view(consumer: Q.ConsumerInfo) -> dict:
    return {
        "queue": {"name": consumer.queue, "vhost": consumer.vhost},
        "consumer_tag": consumer.tag,
        "channel_details": {"name": f"{consumer.connection} ({consumer.channel})",
                            "number": consumer.channel, "connection_name": consumer.connection,
                            "node": "raftmq"},
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "active": True,
        "activity_status": "up",
        "arguments": {},
    }


async def list_consumers(request: web.Request) -> web.Response:
    broker = context(request).broker
    rows = [_consumer_view(c) for v in _visible_vhosts(request, _vhost_arg(request))
            for c in await consumer_infos(broker, v)]  # issue 34: queue groups' consumers too
    return columns(request, rows)


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/queues", list_queues)
    r.add_get("/api/queues/{vhost}", list_queues)
    r.add_get("/api/queues/{vhost}/{name}", get_queue)
    r.add_put("/api/queues/{vhost}/{name}", put_queue)
    r.add_delete("/api/queues/{vhost}/{name}", delete_queue)
    r.add_delete("/api/queues/{vhost}/{name}/contents", purge_queue)
    r.add_post("/api/queues/{vhost}/{name}/get", get_messages)
    r.add_get("/api/queues/{vhost}/{name}/bindings", queue_bindings)
    r.add_get("/api/exchanges", list_exchanges)
    r.add_get("/api/exchanges/{vhost}", list_exchanges)
    r.add_get("/api/exchanges/{vhost}/{name}", get_exchange)
    r.add_put("/api/exchanges/{vhost}/{name}", put_exchange)
    r.add_delete("/api/exchanges/{vhost}/{name}", delete_exchange)
    r.add_post("/api/exchanges/{vhost}/{name}/publish", publish)
    r.add_get("/api/exchanges/{vhost}/{name}/bindings/{side:source|destination}", exchange_bindings)
    r.add_get("/api/bindings", list_bindings)
    r.add_get("/api/bindings/{vhost}", list_bindings)
    pair = "/api/bindings/{vhost}/e/{source}/{kind:[qe]}/{destination}"
    r.add_get(pair, list_pair)
    r.add_post(pair, create_binding)
    r.add_get(pair + "/{props}", get_binding)
    r.add_delete(pair + "/{props}", delete_binding)
    r.add_get("/api/consumers", list_consumers)
    r.add_get("/api/consumers/{vhost}", list_consumers)
