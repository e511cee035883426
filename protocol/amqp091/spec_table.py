"""The method table of AMQP 0-9-1: every class and method of the reference, plus RabbitMQ's extensions.

One line per method: ``class-name class-id  method-name method-id  flags  fields``.  Flags: ``S`` the
method is synchronous (it expects a reply), ``C`` it carries content.  Fields are ``name:type`` with
types octet, short, long, longlong, timestamp, bit, shortstr, longstr, table.  Field names are the
reference's with ``-`` turned into ``_`` (and ``global`` spelled ``global_``).

:mod:`.methods` generates the method classes and their codecs from this table; nothing is
hand-written per method.
"""

from __future__ import annotations

METHOD_TABLE = """
connection 10 start 10 S version_major:octet version_minor:octet server_properties:table mechanisms:longstr locales:longstr
connection 10 start-ok 11 - client_properties:table mechanism:shortstr response:longstr locale:shortstr
connection 10 secure 20 S challenge:longstr
connection 10 secure-ok 21 - response:longstr
connection 10 tune 30 S channel_max:short frame_max:long heartbeat:short
connection 10 tune-ok 31 - channel_max:short frame_max:long heartbeat:short
connection 10 open 40 S virtual_host:shortstr capabilities:shortstr insist:bit
connection 10 open-ok 41 - known_hosts:shortstr
connection 10 close 50 S reply_code:short reply_text:shortstr class_id:short method_id:short
connection 10 close-ok 51 -
connection 10 blocked 60 - reason:shortstr
connection 10 unblocked 61 -
connection 10 update-secret 70 S new_secret:longstr reason:shortstr
connection 10 update-secret-ok 71 -
channel 20 open 10 S out_of_band:shortstr
channel 20 open-ok 11 - channel_id:longstr
channel 20 flow 20 S active:bit
channel 20 flow-ok 21 - active:bit
channel 20 close 40 S reply_code:short reply_text:shortstr class_id:short method_id:short
channel 20 close-ok 41 -
access 30 request 10 S realm:shortstr exclusive:bit passive:bit active:bit write:bit read:bit
access 30 request-ok 11 - ticket:short
exchange 40 declare 10 S ticket:short exchange:shortstr type:shortstr passive:bit durable:bit auto_delete:bit internal:bit no_wait:bit arguments:table
exchange 40 declare-ok 11 -
exchange 40 delete 20 S ticket:short exchange:shortstr if_unused:bit no_wait:bit
exchange 40 delete-ok 21 -
exchange 40 bind 30 S ticket:short destination:shortstr source:shortstr routing_key:shortstr no_wait:bit arguments:table
exchange 40 bind-ok 31 -
exchange 40 unbind 40 S ticket:short destination:shortstr source:shortstr routing_key:shortstr no_wait:bit arguments:table
exchange 40 unbind-ok 51 -
queue 50 declare 10 S ticket:short queue:shortstr passive:bit durable:bit exclusive:bit auto_delete:bit no_wait:bit arguments:table
queue 50 declare-ok 11 - queue:shortstr message_count:long consumer_count:long
queue 50 bind 20 S ticket:short queue:shortstr exchange:shortstr routing_key:shortstr no_wait:bit arguments:table
queue 50 bind-ok 21 -
queue 50 purge 30 S ticket:short queue:shortstr no_wait:bit
queue 50 purge-ok 31 - message_count:long
queue 50 delete 40 S ticket:short queue:shortstr if_unused:bit if_empty:bit no_wait:bit
queue 50 delete-ok 41 - message_count:long
queue 50 unbind 50 S ticket:short queue:shortstr exchange:shortstr routing_key:shortstr arguments:table
queue 50 unbind-ok 51 -
basic 60 qos 10 S prefetch_size:long prefetch_count:short global_:bit
basic 60 qos-ok 11 -
basic 60 consume 20 S ticket:short queue:shortstr consumer_tag:shortstr no_local:bit no_ack:bit exclusive:bit no_wait:bit arguments:table
basic 60 consume-ok 21 - consumer_tag:shortstr
basic 60 cancel 30 S consumer_tag:shortstr no_wait:bit
basic 60 cancel-ok 31 - consumer_tag:shortstr
basic 60 publish 40 C ticket:short exchange:shortstr routing_key:shortstr mandatory:bit immediate:bit
basic 60 return 50 C reply_code:short reply_text:shortstr exchange:shortstr routing_key:shortstr
basic 60 deliver 60 C consumer_tag:shortstr delivery_tag:longlong redelivered:bit exchange:shortstr routing_key:shortstr
basic 60 get 70 S ticket:short queue:shortstr no_ack:bit
basic 60 get-ok 71 C delivery_tag:longlong redelivered:bit exchange:shortstr routing_key:shortstr message_count:long
basic 60 get-empty 72 - cluster_id:shortstr
basic 60 ack 80 - delivery_tag:longlong multiple:bit
basic 60 reject 90 - delivery_tag:longlong requeue:bit
basic 60 recover-async 100 - requeue:bit
basic 60 recover 110 S requeue:bit
basic 60 recover-ok 111 -
basic 60 nack 120 - delivery_tag:longlong multiple:bit requeue:bit
confirm 85 select 10 S no_wait:bit
confirm 85 select-ok 11 -
tx 90 select 10 S
tx 90 select-ok 11 -
tx 90 commit 20 S
tx 90 commit-ok 21 -
tx 90 rollback 30 S
tx 90 rollback-ok 31 -
"""

#: Field defaults by type, used when a method is built without that argument.
TYPE_DEFAULTS = {
    "octet": 0, "short": 0, "long": 0, "longlong": 0, "timestamp": 0,
    "bit": False, "shortstr": "", "longstr": b"", "table": None,
}

#: Method-specific defaults that differ from the type's (the reference's documented defaults).
FIELD_DEFAULTS = {
    ("exchange", "declare", "type"): "direct",
    ("basic", "deliver", "redelivered"): False,
    ("connection", "open", "virtual_host"): "/",
    ("connection", "start-ok", "mechanism"): "PLAIN",
    ("connection", "start-ok", "locale"): "en_US",
    ("connection", "start", "version_minor"): 9,
    ("connection", "start", "mechanisms"): b"PLAIN",
    ("connection", "start", "locales"): b"en_US",
    ("basic", "get", "no_ack"): False,
}


def parse_table(text: str = METHOD_TABLE) -> list[tuple[str, int, str, int, str, list[tuple[str, str]]]]:
    """The table as tuples (class, class_id, method, method_id, flags, [(field, type)...])."""
    rows = []
    for line in text.strip().splitlines():
        words = line.split()
        cls, cls_id, meth, meth_id, flags = words[:5]
        fields: list[tuple[str, str]] = []
        for word in words[5:]:
            name, _, typ = word.partition(":")
            fields.append((name, typ))
        for _name, typ in fields:
            if typ not in TYPE_DEFAULTS:
                raise ValueError(f"unknown field type {typ!r} in {cls}.{meth}")
        rows.append((cls, int(cls_id), meth, int(meth_id), flags, fields))
    return rows
