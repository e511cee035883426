"""Checksums of the single-node LMDB state (store/disk/durable.py, store format 3, issue 29).

Every record is sealed (marker, CRC32C over key and payload); ``load`` checks each one and refuses
the whole state (``StateDamaged``, naming every damaged key) rather than acting on a damaged record;
``verify_state`` finds the same damage without writing; a store of format 2 (written before checksums)
still opens: it is checked for structure and sealed at open.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import lmdb
import msgpack
import pytest

from raftmq.integrity import checksum
from raftmq.store.core.effects import PUT, PUT_WITH_BODY
from raftmq.store.core.persistence import binding_key
from raftmq.store.disk import durable
from raftmq.store.disk.durable import (
    FIRST_CHECKED_FORMAT,
    TABLES,
    DurableStore,
    StateDamaged,
    entry_key,
    verify_state,
)
from raftmq.store.disk.sealed import SEALED, seal, unseal
from raftmq.versions import STORE_FORMAT

FIXTURE_2 = Path(__file__).parent / "fixtures" / "state-format-2.lmdb"
BODY = b"precious-body-" + bytes(range(200))
DELAYED_BODY = b"held-back-" + bytes(range(200, 0, -1))


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _populate(path: str) -> None:
    """One record in every table that a node fills (vhost, user, exchange, queue, binding, message,
    entry, delayed message, counters and applied index)."""
    store = DurableStore(path)
    ops = [
        (PUT, "vhosts", b"/", b""),
        (PUT, "users", b"alice", _pack(["hash", ["admin"], False, {"/": [".*", ".*", ".*"]}])),
        (PUT, "exchanges", _pack(["/", "ex-one"]), _pack(["direct", False, False, {}])),
        (PUT, "queues", _pack(["/", "queue-one"]), _pack([1, False, {}])),
        (PUT, "bindings", binding_key("/", "ex-one", True, "queue-one", "rk-one", {}), b""),
        (PUT_WITH_BODY, "messages", (1).to_bytes(8, "big"), ["ex-one", "rk-one", b"\x00\x00", None, 0, 7], 3, 1),
        (PUT, "entries", entry_key(1, 1), _pack([1, None, 0, 0])),
        (PUT_WITH_BODY, "delayed", entry_key(99, 1), ["/", "dx", "rk", 2, b"\x00\x00", None, True, 0, 7, None, 5],
         5, 2),
    ]
    store.commit(ops, (2, 3), 11, body_of={1: BODY, 2: DELAYED_BODY}.get)
    store.close()


def _flip(path: str, pattern: bytes, at: int = 0) -> None:
    """XOR one byte of the only occurrence of ``pattern`` in the store's data file."""
    data_file = Path(path) / "data.mdb"
    raw = bytearray(data_file.read_bytes())
    offset = raw.find(pattern)
    assert offset >= 0 and raw.find(pattern, offset + 1) < 0, "the pattern must occur exactly once"
    raw[offset + at] ^= 0x20
    data_file.write_bytes(bytes(raw))


def _raw_records(path: str, table: str) -> list[tuple[bytes, bytes]]:
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=len(TABLES) + 4)
    try:
        db = env.open_db(table.encode(), create=False)
        with env.begin(db=db) as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()


def _rewrite(path: str, table: str, change) -> None:
    """Replace each (key, stored value) of ``table`` by ``change(key, value)`` (None: delete it)."""
    env = lmdb.open(path, max_dbs=len(TABLES) + 4)
    try:
        db = env.open_db(table.encode())
        with env.begin(write=True, db=db) as txn:
            for key, value in [(bytes(k), bytes(v)) for k, v in txn.cursor()]:
                new = change(key, value)
                txn.delete(key)
                if new is not None:
                    txn.put(new[0], new[1])
    finally:
        env.close()


def test_a_sealed_record_is_marker_crc32c_of_key_and_payload_then_payload():
    """The seal is the store-wide checksum (integrity.checksum) over key then payload, behind 0xC1."""
    value = seal(b"key", b"payload")
    assert value[0] == SEALED and value[5:] == b"payload"
    assert int.from_bytes(value[1:5], "big") == checksum(b"key" + b"payload")
    assert unseal(b"key", value) == b"payload"
    for bad_key, bad_value, reason in ((b"kez", value, "checksum mismatch"),
                                       (b"key", value[:-1] + b"X", "checksum mismatch"),
                                       (b"key", value[:3], "truncated"),
                                       (b"key", b"payload", "no checksum header")):
        with pytest.raises(ValueError, match=reason):
            unseal(bad_key, bad_value)


def test_every_record_is_stored_sealed_and_loads_back(tmp_path):
    """What commit writes is sealed in every table, and load returns it unchanged."""
    path = str(tmp_path / "state")
    _populate(path)
    for table in TABLES:
        for key, value in _raw_records(path, table):
            if (table, key) != ("meta", b"format"):
                assert value[0] == SEALED, (table, key)
                unseal(key, value)
    assert verify_state(path) == []
    store = DurableStore(path)
    state = store.load()
    assert state.counters == (2, 3) and state.applied_index == 11
    assert state.messages[1][3] == BODY and state.delayed[0][2][5] == DELAYED_BODY
    assert [b[3] for b in state.bindings] == ["queue-one"] and state.vhosts == ["/"]
    assert store.message_bodies([1]) == {1: BODY}
    store.close()


def test_a_flipped_byte_in_a_stored_body_stops_the_load_and_names_the_message(tmp_path, caplog):
    """A bit flip in data.mdb inside a persistent message's body: verify names it; the store opens but
    ``load`` (the node's start) raises StateDamaged naming that message; a body read while running
    (``message_bodies``) leaves the damaged one out and logs CRITICAL."""
    path = str(tmp_path / "state")
    _populate(path)
    _flip(path, b"precious-body-\x00", at=3)  # the message's body
    damages = verify_state(path)
    assert [(d.store, d.where, d.what) for d in damages] == [("state", "messages/message 1", "checksum mismatch")]
    assert "messages/message 1" in str(damages[0]) and path in str(damages[0])
    store = DurableStore(path)
    with pytest.raises(StateDamaged) as info:
        store.load()
    assert info.value.damages == damages
    assert "messages/message 1: checksum mismatch" in str(info.value) and "raftmq verify" in str(info.value)
    with caplog.at_level("CRITICAL"):
        assert store.message_bodies([1]) == {}
    assert "message 1 is damaged" in caplog.text
    store.close()


def test_a_flipped_byte_in_a_key_is_caught_though_the_value_is_empty(tmp_path):
    """A binding's record is all key (value b""): the CRC covers the key, so a flip in the queue name
    inside the binding key is damage, not a binding to another queue."""
    path = str(tmp_path / "state")
    _populate(path)
    _flip(path, b"rk-one\x80", at=1)  # the binding key ends with the routing key and {} (0x80)
    damages = verify_state(path)
    assert len(damages) == 1 and damages[0].where.startswith("bindings/")
    assert damages[0].what == "checksum mismatch"
    with pytest.raises(StateDamaged):
        DurableStore(path).load()


@pytest.mark.parametrize("table", [t for t in TABLES])
def test_damage_in_any_table_is_found_by_load_and_verify(tmp_path, table):
    """Every table's records are checked: the last payload byte flipped in each one in turn."""
    path = str(tmp_path / "state")
    _populate(path)

    def damage(key: bytes, value: bytes):
        if (table, key) == ("meta", b"format"):
            return key, value
        return key, value[:-1] + bytes([value[-1] ^ 1]) if len(value) > 5 else value[:4]

    _rewrite(path, table, damage)
    expected = len([k for k, _ in _raw_records(path, table) if (table, k) != ("meta", b"format")])
    assert expected >= 1
    damages = verify_state(path)
    assert len(damages) == expected and all(d.where.startswith(f"{table}/") for d in damages), damages
    with pytest.raises(StateDamaged) as info:
        DurableStore(path).load()
    assert len(info.value.damages) == expected


def test_a_missing_record_header_in_a_checked_store_is_damage(tmp_path):
    """In a format 3 store every record is sealed: an unsealed value (say, its first five bytes lost)
    is damage, never read as an old unchecked record."""
    path = str(tmp_path / "state")
    _populate(path)
    _rewrite(path, "queues", lambda k, v: (k, v[5:]))
    assert [d.what for d in verify_state(path)] == ["no checksum header (every record of this store format has one)"]


def test_a_damaged_format_stamp_is_damage(tmp_path):
    """The stamp stays plain msgpack (an older raftmq reads it to refuse): garbage there is damage."""
    path = str(tmp_path / "state")
    _populate(path)
    _rewrite(path, "meta", lambda k, v: (k, b"\xc1zz") if k == b"format" else (k, v))
    assert [d.where for d in verify_state(path)] == ["meta/'format'"]
    with pytest.raises(StateDamaged):
        DurableStore(path)


def _copy_fixture(tmp_path) -> str:
    path = tmp_path / "state"
    shutil.copytree(FIXTURE_2, path)
    return str(path)


def test_a_format_2_store_opens_and_is_sealed_at_open(tmp_path):
    """The fixture was written by the code of store format 2 (no checksums: a real node, pika, a
    durable queue and exchange, 5 persistent messages, a delayed one).  verify accepts its records on
    their structure; opening it seals every record and stamps format 3; it loads what was written."""
    path = _copy_fixture(tmp_path)
    assert msgpack.unpackb(dict(_raw_records(path, "meta"))[b"format"]) == 2
    assert all(v[:1] != b"\xc1" for _, v in _raw_records(path, "messages"))
    assert verify_state(path) == []
    store = DurableStore(path)
    state = store.load()
    store.close()
    assert sorted(state.messages) == [1, 2, 3, 4, 5]
    assert state.messages[1][3] == b"fixture-body-0" and state.messages[5][3] == bytes(range(256)) * 16
    assert [q[1] for q in state.queues] == ["fq"] and len(state.bindings) == 2 and len(state.entries) == 5
    assert state.delayed[0][2][5] == b"delayed-body"
    assert msgpack.unpackb(dict(_raw_records(path, "meta"))[b"format"]) == STORE_FORMAT >= FIRST_CHECKED_FORMAT
    for table in TABLES:
        for key, value in _raw_records(path, table):
            if (table, key) != ("meta", b"format"):
                unseal(key, value)
    assert verify_state(path) == []
    again = DurableStore(path)
    assert again.load().messages == state.messages
    again.close()


def test_a_format_2_store_with_a_record_that_does_not_decode_is_not_upgraded(tmp_path):
    """Unsealed records can only be checked for structure: a truncated message record stops the open
    (StateDamaged) and nothing is written: the stamp stays 2, no record is sealed."""
    path = _copy_fixture(tmp_path)
    _rewrite(path, "messages", lambda k, v: (k, v[:20]) if k == (3).to_bytes(8, "big") else (k, v))
    damages = verify_state(path)
    assert [(d.where, d.what.split(" (")[0]) for d in damages] == [("messages/message 3", "does not decode")]
    with pytest.raises(StateDamaged):
        DurableStore(path)
    assert msgpack.unpackb(dict(_raw_records(path, "meta"))[b"format"]) == 2
    assert all(v[:1] != b"\xc1" for _, v in _raw_records(path, "messages"))


def test_an_upgrade_cut_short_is_resumed_and_its_sealed_records_are_checked(tmp_path):
    """A crash in the middle of an upgrade leaves some records sealed and the stamp at 2: the next open
    checks the sealed ones (a damaged one stops it), seals the rest, stamps 3."""
    path = _copy_fixture(tmp_path)
    _rewrite(path, "messages", lambda k, v: (k, seal(k, v)) if k <= (2).to_bytes(8, "big") else (k, v))
    assert verify_state(path) == []
    damaged = tmp_path / "damaged"
    shutil.copytree(path, damaged)
    _rewrite(str(damaged), "messages", lambda k, v: (k, v[:-1] + b"!") if k == (1).to_bytes(8, "big") else (k, v))
    assert [d.where for d in verify_state(str(damaged))] == ["messages/message 1"]
    with pytest.raises(StateDamaged):
        DurableStore(str(damaged))
    store = DurableStore(path)
    assert sorted(store.load().messages) == [1, 2, 3, 4, 5]
    store.close()
    assert all(v[0] == SEALED for _, v in _raw_records(path, "messages"))


def test_the_upgrade_seals_in_chunks_and_misses_no_record(tmp_path, monkeypatch):
    """With transactions of 2 records (the fixture has 5 messages, 5 entries, 2 bindings...), every
    record of every table is sealed exactly once and reads back unchanged."""
    path = _copy_fixture(tmp_path)
    before = {t: dict(_raw_records(path, t)) for t in TABLES}
    monkeypatch.setattr(durable, "UPGRADE_CHUNK", 2)
    DurableStore(path).close()
    for table in TABLES:
        after = dict(_raw_records(path, table))
        assert after.keys() == before[table].keys()
        for key, value in after.items():
            if (table, key) != ("meta", b"format"):
                assert unseal(key, value) == before[table][key], (table, key)
