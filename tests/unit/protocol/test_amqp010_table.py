"""The AMQP 0-10 protocol table parses, is self-consistent, and matches the specification text.

Line numbers (``Lnnnn``) refer to /work/shared/specs/amqp-0-10.txt.
"""

from __future__ import annotations

from collections import Counter

import pytest

from raftmq.protocol.amqp010.spec_table import (
    DOMAINS,
    METHODS,
    STRUCTS,
    TYPES,
    Field,
    SpecTableError,
    parse,
)

SPEC = parse()


def fields(cls: str, name: str) -> list[tuple[str, str, bool]]:
    return [tuple(f) for f in SPEC.method(cls, name).fields]


def test_counts_per_class():
    # One signature per control/command in each class's "Methods" list: connection L3709ff, session
    # L4311ff, execution L4907ff, message L5100ff, tx L6213ff, dtx L6346ff, exchange L7026ff, queue L7584ff.
    counts = Counter((m.cls, m.kind) for m in SPEC.methods)
    assert counts == {
        ("connection", "control"): 12,
        ("session", "control"): 13,
        ("execution", "command"): 3,
        ("message", "command"): 12,
        ("tx", "command"): 3,
        ("dtx", "command"): 10,
        ("exchange", "command"): 6,
        ("queue", "command"): 4,
    }
    assert {m.cls: m.class_code for m in SPEC.methods} == {
        "connection": 0x01, "session": 0x02, "execution": 0x03, "message": 0x04,  # L3703, L4301, L4901, L5094
        "tx": 0x05, "dtx": 0x06, "exchange": 0x07, "queue": 0x08,  # L6209, L6340, L7020, L7578
    }
    assert (len(SPEC.types), len(SPEC.domains), len(SPEC.structs)) == (45, 23, 15)


def test_method_codes_are_dense_within_each_class():
    # Every class numbers its controls/commands 0x1..n without gaps in its "Methods" list.
    for cls in {m.cls for m in SPEC.methods}:
        codes = sorted(m.code for m in SPEC.methods if m.cls == cls)
        assert codes == list(range(1, len(codes) + 1)), cls


def test_type_codes_and_widths():
    t = SPEC.types
    assert (t["str8"].code, t["str8"].width, t["str8"].variable) == (0x85, 1, True)  # L3164
    assert (t["str16"].code, t["str16"].width, t["str16"].variable) == (0x95, 2, True)  # L3172
    assert (t["uint16"].code, t["uint16"].width, t["uint16"].variable) == (0x12, 2, False)  # L2610
    assert (t["map"].code, t["map"].width, t["map"].variable) == (0xA8, 4, True)  # L3182
    assert (t["array"].code, t["struct32"].code, t["vbin8"].code) == (0xAA, 0xAB, 0x80)  # L3186, L3188, L3160
    assert (t["void"].code, t["void"].width, t["bit"].code, t["bit"].width) == (0xF0, 0, 0xF1, 0)  # L2652-2654
    assert (t["uuid"].code, t["uuid"].width, t["bin1024"].width) == (0x48, 16, 128)  # L2636, L2642
    assert (t["dec64"].code, t["dec64"].width) == (0xD8, 9)  # L2650
    # Three types without a type code: sequence-no (L2622), byte-ranges (L3176), sequence-set (L3178).
    assert (t["sequence-no"].code, t["sequence-no"].width, t["sequence-no"].variable) == (None, 4, False)
    assert (t["sequence-set"].code, t["sequence-set"].width, t["sequence-set"].variable) == (None, 2, True)
    assert (t["byte-ranges"].code, t["byte-ranges"].width, t["byte-ranges"].variable) == (None, 2, True)


def test_type_codes_fall_in_their_width_ranges():
    # L1944ff: the code's high bits give the width class.
    fixed = {0x0: 1, 0x1: 2, 0x2: 4, 0x3: 8, 0x4: 16, 0x5: 32, 0x6: 64, 0x7: 128, 0xC: 5, 0xD: 9, 0xF: 0}
    variable = {0x8: 1, 0x9: 2, 0xA: 4}
    for t in SPEC.types.values():
        if t.code is None:
            continue
        assert (variable if t.variable else fixed)[t.code >> 4] == t.width, t.name


def test_connection_open_and_redirect():
    # connection.open: Code 0x7 (L4139); virtual-host str8 required (L4155), capabilities str16-array
    # optional (L4158), insist bit optional (L4163); signature at L3737.
    m = SPEC.method("connection", "open")
    assert (m.kind, m.class_code, m.code) == ("control", 0x01, 0x7)
    assert fields("connection", "open") == [
        ("virtual-host", "str8", True), ("capabilities", "str16-array", False), ("insist", "bit", False)]
    assert SPEC.domains["str16-array"].element == "str16"  # L3690ff
    # connection.redirect: Code 0x9 (L4213); host amqp-host-url required (L4226), known-hosts optional (L4233).
    assert SPEC.method("connection", "redirect").code == 0x9
    assert fields("connection", "redirect") == [
        ("host", "connection.amqp-host-url", True), ("known-hosts", "connection.amqp-host-array", False)]
    assert SPEC.base_type("connection.amqp-host-url") == "str16"  # L3804ff
    assert SPEC.domains["connection.amqp-host-array"].element == "connection.amqp-host-url"  # L3835


def test_connection_close_code_enum():
    # reply-code: close-code required (L4271); close-code uint16 200/320/402/501 (L3777ff).
    assert fields("connection", "close") == [("reply-code", "connection.close-code", True), ("reply-text", "str8", False)]
    d = SPEC.domains["connection.close-code"]
    assert (d.base, d.choices) == ("uint16", {"normal": 200, "connection-forced": 320, "invalid-path": 402,
                                              "framing-error": 501})


def test_connection_tune_fields_are_all_optional_but_tune_ok_channel_max():
    # tune (L4006ff): four optional uint16; tune-ok (L4068ff): channel-max required.
    assert [f.required for f in SPEC.method("connection", "tune").fields] == [False] * 4
    assert fields("connection", "tune-ok") == [
        ("channel-max", "uint16", True), ("max-frame-size", "uint16", False), ("heartbeat", "uint16", False)]


def test_session_attach():
    # session.attach: Code 0x1 (L4469); name required (L4486) of domain session.name = vbin16 (L4418);
    # force bit optional (L4490).
    m = SPEC.method("session", "attach")
    assert (m.kind, m.class_code, m.code) == ("control", 0x02, 0x1)
    assert fields("session", "attach") == [("name", "session.name", True), ("force", "bit", False)]
    assert SPEC.base_type("session.name") == "vbin16"
    # session.gap is the last control, 0xd (L4861ff); looked up by code.
    assert SPEC.by_code("control", 0x02, 0xD).name == "gap"


def test_session_expected_and_command_fragments():
    # expected (L4665ff): commands required, fragments optional; commands is a sequence-set (L4449ff),
    # command-fragments an array of command-fragment (L4457ff), a size 0 pack 0 struct (L4403-4405).
    assert fields("session", "expected") == [
        ("commands", "session.commands", True), ("fragments", "session.command-fragments", False)]
    assert SPEC.base_type("session.commands") == "sequence-set"
    assert SPEC.domains["session.command-fragments"].element == "session.command-fragment"
    s = SPEC.structs["session.command-fragment"]
    assert (s.code, s.size, s.pack) == (None, 0, 0)
    assert s.fields == [Field("command-id", "sequence-no", True), Field("byte-ranges", "byte-ranges", True)]  # L4411ff


def test_session_header_struct():
    # "Domain: session.header" (L4382) is a struct: Size 1, Packing 1 (L4388-4390), uncoded; sync bit (L4396).
    s = SPEC.structs["session.header"]
    assert (s.code, s.size, s.pack, s.fields) == (None, 1, 1, [Field("sync", "bit", False)])


def test_message_transfer():
    # message.transfer: Code 0x1 (L5680); destination optional (L5696), accept-mode required (L5700),
    # acquire-mode required (L5708); "Segments" header and body, both optional (L5713-5730).
    m = SPEC.method("message", "transfer")
    assert (m.kind, m.class_code, m.code) == ("command", 0x04, 0x1)
    assert fields("message", "transfer") == [
        ("destination", "message.destination", False),
        ("accept-mode", "message.accept-mode", True),
        ("acquire-mode", "message.acquire-mode", True)]
    assert m.segments == ("header", "body")
    assert m.header == ("message.delivery-properties", "message.fragment-properties", "message.message-properties")
    assert m.result is None
    # Only message.transfer carries segments among the classes in the table.
    assert [x.name for x in SPEC.methods if x.segments] == ["transfer"]
    assert SPEC.domains["message.accept-mode"].choices == {"explicit": 0, "none": 1}  # L5509ff
    assert SPEC.domains["message.acquire-mode"].choices == {"pre-acquired": 0, "not-acquired": 1}  # L5529ff


def test_execution_result_and_exception():
    # execution.result: signature L4915, command-id sequence-no required (L5032), value struct32 optional (L5034).
    assert SPEC.method("execution", "result").code == 0x2
    assert fields("execution", "result") == [("command-id", "sequence-no", True), ("value", "struct32", False)]
    # execution.exception: signature L4919, arguments L5052-5085: only error-code is required.
    assert SPEC.method("execution", "exception").code == 0x3
    assert fields("execution", "exception") == [
        ("error-code", "execution.error-code", True), ("command-id", "sequence-no", False),
        ("class-code", "uint8", False), ("command-code", "uint8", False), ("field-index", "uint8", False),
        ("description", "str16", False), ("error-info", "map", False)]
    d = SPEC.domains["execution.error-code"]  # L4927ff
    assert (d.base, d.choices["not-found"], d.choices["invalid-argument"], len(d.choices)) == ("uint16", 404, 542, 13)
    assert fields("execution", "sync") == []  # L4911, L5005ff


def test_message_accept_and_acquire():
    # accept(transfers: session.commands) 0x2 (L5108), transfers required (L5768): a sequence-set.
    assert SPEC.method("message", "accept").code == 0x2
    assert fields("message", "accept") == [("transfers", "session.commands", True)]
    assert SPEC.base_type(SPEC.method("message", "accept").fields[0].type) == "sequence-set"
    # acquire: result struct, Size 4 Packing 2 (L5878-5884), transfers required (L5890).
    m = SPEC.method("message", "acquire")
    assert m.result == "message.acquired"
    s = SPEC.structs["message.acquired"]
    assert (s.code, s.size, s.pack, s.fields) == (0x0404, 4, 2, [Field("transfers", "session.commands", True)])
    assert SPEC.method("message", "resume").result == "message.message-resume-result"  # L5933ff


def test_message_subscribe():
    # signature L5128ff; queue required, accept-mode/acquire-mode required (L5972, L5979), the rest optional.
    assert fields("message", "subscribe") == [
        ("queue", "queue.name", True), ("destination", "message.destination", False),
        ("accept-mode", "message.accept-mode", True), ("acquire-mode", "message.acquire-mode", True),
        ("exclusive", "bit", False), ("resume-id", "message.resume-id", False), ("resume-ttl", "uint64", False),
        ("arguments", "map", False)]


def test_queue_declare_and_query():
    # queue.declare: signature L7588-7591; queue required (L7654), the others optional (L7656-7687).
    m = SPEC.method("queue", "declare")
    assert (m.kind, m.class_code, m.code) == ("command", 0x08, 0x1)
    assert fields("queue", "declare") == [
        ("queue", "queue.name", True), ("alternate-exchange", "exchange.name", False), ("passive", "bit", False),
        ("durable", "bit", False), ("exclusive", "bit", False), ("auto-delete", "bit", False),
        ("arguments", "map", False)]
    assert SPEC.base_type("queue.name") == SPEC.base_type("exchange.name") == "str8"  # L7630ff, L7108ff
    # queue.query result (L7928-7961): queue, message-count and subscriber-count required.
    q = SPEC.method("queue", "query")
    assert (q.code, q.result) == (0x4, "queue.queue-query-result")
    s = SPEC.structs[q.result]
    assert [(f.name, f.required) for f in s.fields] == [
        ("queue", True), ("alternate-exchange", False), ("durable", False), ("exclusive", False),
        ("auto-delete", False), ("arguments", False), ("message-count", True), ("subscriber-count", True)]


def test_exchange_bound_and_query():
    # exchange.bound (L7509ff): queue required (L7528), result of five bits (L7542ff).
    assert fields("exchange", "bound") == [
        ("exchange", "str8", False), ("queue", "str8", True), ("binding-key", "str8", False), ("arguments", "map", False)]
    s = SPEC.structs[SPEC.method("exchange", "bound").result]
    assert s.name == "exchange-bound-result"
    assert [f.type for f in s.fields] == ["bit"] * 5
    assert SPEC.method("exchange", "query").result == "exchange.exchange-query-result"  # L7320ff


def test_struct_codes_and_widths():
    # The text prints no struct codes; these come from the brief (and agree with the spec's XML).
    # Size/packing are printed: L5274, L5397, L5437, L5884, L5939, L7326, L7548, L7934 all read "4 2".
    expected = {
        "message.delivery-properties": 0x0401, "message.fragment-properties": 0x0402,
        "message.message-properties": 0x0403, "message.acquired": 0x0404, "message.message-resume-result": 0x0405,
        "exchange.exchange-query-result": 0x0701, "exchange.exchange-bound-result": 0x0702,
        "queue.queue-query-result": 0x0801,
        "dtx.xa-result": 0x0601, "dtx.get-timeout-result": 0x0602, "dtx.recover-result": 0x0603,
    }
    for key, code in expected.items():
        s = SPEC.structs[key]
        assert (s.code, s.size, s.pack) == (code, 4, 2), key
        assert SPEC.struct_by_code(code) is s
    uncoded = {k for k, s in SPEC.structs.items() if s.code is None}
    assert uncoded == {"session.header", "session.command-fragment", "message.reply-to", "dtx.xid"}
    assert (SPEC.structs["message.reply-to"].size, SPEC.structs["message.reply-to"].pack) == (2, 2)  # L5422


def test_delivery_and_fragment_properties():
    # delivery-properties (L5268ff): priority and delivery-mode are the required fields.
    s = SPEC.structs["message.delivery-properties"]
    assert [f.name for f in s.fields if f.required] == ["priority", "delivery-mode"]
    assert [f.name for f in s.fields][:3] == ["discard-unroutable", "immediate", "redelivered"]
    assert s.fields[3] == Field("priority", "message.delivery-priority", True)
    assert SPEC.domains["message.delivery-mode"].choices == {"non-persistent": 1, "persistent": 2}  # L5598, L5605
    assert len(s.fields) == 12
    # fragment-properties: "bit default: 1first", "bit default: 1last" (L5403, L5407).
    f = SPEC.structs["message.fragment-properties"]
    assert f.defaults == {"first": 1, "last": 1}
    assert [x.name for x in f.fields] == ["first", "last", "fragment-size"]
    assert [x.name for x in SPEC.structs["message.message-properties"].fields][3] == "reply-to"
    assert SPEC.structs["message.message-properties"].fields[3].type == "message.reply-to"


def test_dtx_xid_and_results():
    # dtx.xid (L6442ff): Size 2 Packing 2 (L6450), three required fields (L6456-6460), no code.
    s = SPEC.structs["dtx.xid"]
    assert (s.code, s.size, s.pack) == (None, 2, 2)
    assert s.fields == [Field("format", "uint32", True), Field("global-id", "vbin8", True),
                        Field("branch-id", "vbin8", True)]
    # "Result xa-resultType" at L6571 (start), L6654 (end), L6724 (commit), L6883 (prepare), L6963 (rollback).
    with_xa = sorted(m.name for m in SPEC.methods if m.result == "dtx.xa-result")
    assert with_xa == ["commit", "end", "prepare", "rollback", "start"]
    assert SPEC.method("dtx", "forget").result is None and SPEC.method("dtx", "set-timeout").result is None
    assert SPEC.structs["dtx.recover-result"].fields == [Field("in-doubt", "array", True)]  # L6914
    assert fields("dtx", "set-timeout") == [("xid", "dtx.xid", True), ("timeout", "uint32", True)]  # L6994


def test_every_field_resolves_to_a_primitive_type_or_struct():
    for m in SPEC.methods:
        for f in m.fields:
            base = SPEC.base_type(f.type)
            assert base in SPEC.types or base in SPEC.structs, (m.cls, m.name, f)
    for s in SPEC.structs.values():
        for f in s.fields:
            assert SPEC.base_type(f.type) in SPEC.types or f.type in SPEC.structs, (s.key, f)


@pytest.mark.parametrize("tables, message", [
    ({"methods": METHODS + "queue 0x08 command extra 0x4\n"}, "already a command"),
    ({"methods": METHODS + "queue 0x08 command extra 0x5 x:no-such-type\n"}, "unknown type"),
    ({"methods": METHODS + "queue 0x09 command extra 0x5\n"}, "has code 0x08"),
    ({"methods": METHODS + "queue 0x08 command extra 0x5 result=name\n"}, "coded struct of size 4"),
    ({"methods": METHODS + "queue 0x08 command extra 0x5 x:bit x:bit\n"}, "field x twice"),
    ({"structs": STRUCTS + "queue extra 0x0701 size=4 pack=2\n"}, "not in class queue"),
    ({"structs": STRUCTS + "queue extra - size=3 pack=2\n"}, "size and pack"),
    ({"domains": DOMAINS + "queue.extra no-such-type\n"}, "is not a type"),
    ({"types": TYPES + "extra 0x85 v1\n"}, "duplicate type codes"),
])
def test_inconsistent_tables_are_rejected(tables, message):
    with pytest.raises(SpecTableError, match=message):
        parse(**tables)
