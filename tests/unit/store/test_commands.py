"""Typed commands (store/core/commands.py): one type per operation, and the field orders hot paths rely on."""

from __future__ import annotations

from raftmq.store.core.commands import COMMAND_TYPES, OK, Ok, Op, Publish, decode_batch, encode_batch, make


def test_every_operation_has_exactly_one_type_whose_op_is_last_and_defaulted():
    assert set(COMMAND_TYPES) == set(Op)
    for op, kind in COMMAND_TYPES.items():
        assert kind._fields[-1] == "op" and kind._field_defaults["op"] == op
        assert kind._fields[:2] == ("conn", "token")


def test_the_publish_field_order_the_front_end_and_delivery_build_and_unpack_by_position():
    """node/amqp091/channel.py builds Publish with tuple.__new__ and store/core/delivery.py unpacks it
    by position (the publish hot path): a change of its fields must change both."""
    assert Publish._fields == ("conn", "token", "channel", "vhost", "exchange", "routing_key", "mandatory",
                               "properties", "body", "persistent", "priority", "expiration",
                               "properties_format", "op")


def test_a_command_built_positionally_equals_one_built_by_name_and_survives_the_log():
    by_name = Publish(conn="c", token=7, channel=1, vhost="/", exchange="x", routing_key="k", mandatory=False,
                      properties=b"\x00\x00", body=b"b", persistent=True, priority=0, expiration=None)
    assert by_name == tuple.__new__(Publish, ("c", 7, 1, "/", "x", "k", False, b"\x00\x00", b"b", True, 0, None,
                                              0, Op.PUBLISH))
    assert make(Op.PUBLISH, *by_name[:-2]) == by_name
    (back,) = decode_batch(encode_batch([by_name]))
    assert back == by_name and back.__class__ is Publish


def test_results_are_tuples_that_start_with_their_status():
    result = tuple.__new__(Ok, (OK, 3))
    assert result == Ok(OK, 3) and result.value == 3 and result[0] == OK
