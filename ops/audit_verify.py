"""``raftmq audit verify``: check an audit history against its hash chain, and against another node's.

The chain (issue 36, docs/design.md "Tamper evidence: the event chain"): every applied batch with
events moves the replicated head on, head = SHA-256(previous head || the msgpack of each event's
chained fields, ``store/core/events.py``).  The history's ``chain`` table holds one record per batch
(written by ``store/disk/event_writer.py``): ``[first_seq, last_seq, raft_index, previous, head, seals,
dropped]`` where ``seals`` are the 4-byte CRC32C seals of the kept events' records as written (a hint
naming the event an edit changed; the head is the proof) and ``dropped`` the seqs this node's
retention did not keep.

Checked here, alone (``verify_history``):

- every record decodes and its CRC holds (a damaged record is named, as by ``raftmq verify``);
- each chain record's head follows from its previous head and its leaves, and its previous head is
  the head of the batch before it (a break is accepted only where ``meta`` records a gap: the node
  installed a state snapshot there);
- every event of a batch that the node kept is there with the seal it was written with (an event
  edited and sealed again is named: seq, table, the record); an event recorded as kept but missing
  is named (deleted); an event outside every chained batch after the first is named (inserted);
- a batch whose events were all kept gives its head from them (an edit that also rewrote the seal
  hint is caught here, naming the batch);
- events older than the first chain record (written before issue 36) are counted, not judged.

Against another history (``--against DIR``, another node's data directory or snapshot): the batches
both hold must have equal heads; the first event that differs is named with the fields that differ
where both nodes kept it.  This is what catches a history rewritten *consistently* on
one node (leaves and heads recomputed): its heads then differ from every other node's.

Groups (issue 34): a node with queue groups keeps one history and one chain per group
(``<data>/groups/g<N>/events``; a snapshot's ``<out>/groups/g<N>``), each numbered by its group.
Given a data directory or a snapshot, every group's history is verified on its own, one line each;
``--against`` compares each group's with the same group's of the other node (a group the other
lacks is a finding), ``--peer`` each group's with the running member's chain of that group
(``GET /api/raftmq/audit/chain?group=N``).  Group g is never compared with another group.

Exit status: 0 intact (one summary line per group), 1 something is wrong (the first bad event
first), 2 usage.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import sys
import urllib.parse
import urllib.request
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import cast

import lmdb

from raftmq.store.core.events import (
    CHAIN_TABLE,
    EVENT_FIELDS,
    chain_next,
    chain_packed,
    chained_fields,
)
from raftmq.store.disk import history as EV

EXIT_INTACT, EXIT_BAD, EXIT_USAGE = 0, 1, 2
PAGE_LIMIT = 10_000  # chain records per page of GET /api/raftmq/audit/chain
_SEAL = 4  # bytes of a seal hint (sealed.py's CRC32C)


@dataclass(frozen=True)
class Finding:
    """One thing wrong, as printed: the event's seq (None for a record that is no event), the table."""

    seq: int | None
    table: str
    what: str

    def __str__(self) -> str:
        where = f"seq {self.seq} ({self.table})" if self.seq is not None else self.table
        return f"{where}: {self.what}"


@dataclass
class Batch:
    """One chain record, decoded."""

    first: int
    last: int
    raft_index: int | None
    previous: bytes
    head: bytes
    seals: bytes
    dropped: frozenset[int]

    def seal_map(self) -> dict[int, bytes]:
        """The kept events' seal hints by seq (the dropped ones have none)."""
        kept = [seq for seq in range(self.first, self.last + 1) if seq not in self.dropped]
        return {seq: self.seals[i * _SEAL:(i + 1) * _SEAL] for i, seq in enumerate(kept)}

    def kept(self) -> int:
        return self.last - self.first + 1 - len(self.dropped)


@dataclass
class Report:
    """What a verification found (``findings`` empty: intact)."""

    path: str
    batches: int = 0
    events_checked: int = 0
    not_kept: int = 0  # events the node's retention did not keep: their leaves are chained all the same
    unchained: int = 0  # events older than the chain (written before issue 36)
    trimmed_batches: int = 0  # batches partly trimmed by age/size limits: their kept events checked
    partial_batches: int = 0  # batches with events not kept: their head is proved against a peer only
    gaps_accepted: int = 0  # chain breaks where the node installed a state snapshot (meta gaps)
    first_seq: int = 0
    last_seq: int = 0
    head: bytes = b""
    compared: int = 0  # batches compared with the other history
    findings: list[Finding] = field(default_factory=list)


class _History:
    """One history read in a single read transaction (a consistent view, even of a running node)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.env = EV.open_history(path)
        self.txn = self.env.begin()
        self.tables = EV.open_tables(self.env, create=False, txn=self.txn)
        self.check = EV.checker(self.txn, self.tables, path)
        self.info = EV.info(self.txn, self.tables, self.check)

    def close(self) -> None:
        self.txn.abort()
        self.env.close()

    def batches(self, findings: list[Finding]) -> list[Batch]:
        db = self.tables.get(CHAIN_TABLE)
        out: list[Batch] = []
        if db is None:
            return out
        for key, value in self.txn.cursor(db=db):
            try:
                first, last, index, previous, head, seals, dropped = self.check.decode(CHAIN_TABLE, key, value)
            except EV.HistoryDamaged as exc:
                findings.extend(Finding(None, CHAIN_TABLE, f"{d.where}: {d.what}") for d in exc.damages)
                continue
            except (TypeError, ValueError):
                findings.append(Finding(None, CHAIN_TABLE, f"{EV.describe_key(CHAIN_TABLE, bytes(key))}: "
                                                           "not a chain record"))
                continue
            out.append(Batch(first, last, index, bytes(previous), bytes(head), bytes(seals), frozenset(dropped)))
        return out

    def event(self, seq: int) -> list | None:
        return self.sealed_event(seq)[0]

    def sealed_event(self, seq: int) -> tuple[list | None, bytes]:
        """The event record (checked) and its seal's CRC bytes; (None, b"") if there is none."""
        db = self.tables.get("events")
        key = EV.U64.pack(seq)
        value = self.txn.get(key, db=db) if db is not None else None
        if value is None:
            return None, b""
        return self.check.decode("events", key, value), bytes(value[1:1 + _SEAL])

    def event_seqs(self) -> list[int]:
        db = self.tables.get("events")
        if db is None:
            return []
        return [EV.U64.unpack(key)[0] for key in self.txn.cursor(db=db).iternext(keys=True, values=False)]


def _show(record: list) -> str:
    names = [*EVENT_FIELDS[:10], "raft_index", *(f"field{i}" for i in range(11, len(record)))]
    shown = dict(zip(names, record, strict=False))
    shown["kind"] = f"{EV.KIND_NAMES.get(shown.get('kind'), shown.get('kind'))}"
    return ", ".join(f"{k}={v!r}" for k, v in shown.items() if k not in ("seq", "raft_index"))


def _in_gap(gaps: list, low: int, high: int) -> bool:
    return any(g_low <= low and high <= g_high for g_low, g_high in gaps)


def _differences(mine: list, theirs: list) -> str:
    """The fields of two records of one event that differ (raft_index aside: a node-local detail)."""
    names = [*EVENT_FIELDS, *(f"field{i}" for i in range(len(EVENT_FIELDS), max(len(mine), len(theirs))))]
    return "; ".join(f"{n}: {a!r} here, {c!r} there" for n, a, c in zip(names, mine, theirs, strict=False)
                     if a != c and n != "raft_index")


def _check_batches(h: _History, batches: list[Batch], report: Report, other: _History | None = None) -> None:
    findings = report.findings
    first_kept = h.info.first_seq
    previous: Batch | None = None
    for b in batches:
        if b.last < b.first or len(b.seals) != _SEAL * b.kept():
            findings.append(Finding(b.first, CHAIN_TABLE, f"chain record of seqs {b.first}..{b.last} holds "
                                                          f"{len(b.seals) // _SEAL} seals for {b.kept()} kept events"))
            previous = b
            continue
        if previous is not None:
            if b.first == previous.last + 1:
                if b.previous != previous.head:
                    findings.append(Finding(b.first, CHAIN_TABLE,
                                            f"the batch of seqs {b.first}..{b.last} does not continue the head of "
                                            f"the batch before it ({previous.first}..{previous.last})"))
            elif b.first > previous.last + 1:
                if _in_gap(h.info.gaps, previous.last + 1, b.first - 1):
                    report.gaps_accepted += 1
                else:
                    findings.append(Finding(previous.last + 1, "events",
                                            f"events {previous.last + 1}..{b.first - 1} and their chain record are "
                                            "missing (deleted; no snapshot install recorded there)"))
            else:
                findings.append(Finding(b.first, CHAIN_TABLE, f"batch of seqs {b.first}..{b.last} overlaps the "
                                                              f"one before ({previous.first}..{previous.last})"))
        previous = b
        report.batches += 1
        seals = b.seal_map()
        stream: list[bytes] | None = [] if not b.dropped else None  # None: the head cannot be recomputed here
        bad_before = len(findings)
        for seq in range(b.first, b.last + 1):
            record, sealed = h.sealed_event(seq)
            if seq in b.dropped:
                report.not_kept += 1
                if record is not None:
                    findings.append(Finding(seq, "events", f"present but chained as not kept ({_show(record)}): "
                                                           "an inserted event"))
                continue
            if record is None:
                stream = None
                if seq < first_kept:
                    report.trimmed_batches += seq == b.first  # trimmed by the age/size limits, oldest first
                else:
                    findings.append(Finding(seq, "events", "missing: the chain says this node kept it (deleted)"))
                continue
            report.events_checked += 1
            fields = chained_fields(record)
            if sealed != seals[seq] or record[0] != seq:
                theirs = other.event(seq) if other is not None else None
                compared = (f"; in {other.path}: {_differences(record, theirs) or 'the same fields'}"
                            if other is not None and theirs is not None else "")
                findings.append(Finding(seq, "events", f"the record is not the one written (edited and sealed "
                                                       f"again): {_show(record)}{compared}"))
            elif record[10] != b.raft_index:
                findings.append(Finding(seq, "events", f"raft_index {record[10]!r} but the chain says {b.raft_index!r}"))
            if stream is not None:
                stream.append(chain_packed(fields))
        if b.dropped:
            report.partial_batches += 1
        if stream is not None and len(findings) == bad_before and chain_next(b.previous, b"".join(stream)) != b.head:
            findings.append(Finding(b.first, CHAIN_TABLE, f"the events of seqs {b.first}..{b.last} do not give the "
                                                          "batch's head: an event was changed along with its seal "
                                                          "hint, or the chain record was edited"))


def _check_unchained(h: _History, batches: list[Batch], report: Report) -> None:
    """Events outside every chain record: older than the chain (counted), or inserted (named)."""
    starts = [b.first for b in batches]
    chain_start = starts[0] if starts else None
    for seq in h.event_seqs():
        if chain_start is None or seq < chain_start:
            report.unchained += 1
            continue
        i = bisect_right(starts, seq) - 1
        if seq > batches[i].last:
            record = h.event(seq)
            report.findings.append(Finding(seq, "events", f"not covered by any chain record: an inserted event "
                                                          f"({_show(record) if record else '?'})"))


def _compare(h: _History, mine: list[Batch], other: _History, report: Report) -> None:
    """The batches both histories hold: equal heads, else the first event that differs."""
    theirs = {b.first: b for b in other.batches(report.findings)}
    where = f"than in {other.path}"
    for b in mine:
        o = theirs.get(b.first)
        if o is None:
            continue
        report.compared += 1
        if (o.last, o.previous, o.head) == (b.last, b.previous, b.head):
            continue
        for seq in range(b.first, min(b.last, o.last) + 1):
            mine_rec, their_rec = h.event(seq), other.event(seq)
            fields = _differences(mine_rec, their_rec) if mine_rec is not None and their_rec is not None else ""
            if not fields:
                continue
            what = fields
            report.findings.append(Finding(seq, "events", f"differs {where}: {what}"))
            break
        else:
            report.findings.append(Finding(b.first, CHAIN_TABLE, f"the batch of seqs {b.first}..{b.last} has "
                                                                 f"another head {where} (in an event one of the two "
                                                                 "did not keep, or in the chain record)"))


def _plain(value: object) -> object:
    """A record's value as JSON carries it losslessly (bytes as {"hex": ...})."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return {"hex": bytes(value).hex()}
    return value


def chain_page(env: lmdb.Environment, low: int, high: int, limit: int, with_events: bool) -> dict:
    """A node's chain records with low <= first seq < high (at most ``limit``), for a peer's verifier
    (ops/http/auditchain.py); ``with_events``: the events of those batches too."""
    with env.begin() as txn:
        tables = EV.open_tables(env, create=False, txn=txn)
        check = EV.checker(txn, tables, env.path())
        chain_db, events_db = tables.get(CHAIN_TABLE), tables.get("events")
        batches: list = []
        events: dict[str, object] = {}
        if chain_db is None:
            return {"batches": batches, "events": events, "more": False}
        cursor = txn.cursor(db=chain_db)
        more = False
        if cursor.set_range(EV.U64.pack(low)):
            for key, value in cursor:
                first = EV.U64.unpack(key)[0]
                if first >= high:
                    break
                if len(batches) == limit:
                    more = True
                    break
                first, last, index, previous, head, _seals, _dropped = check.decode(CHAIN_TABLE, key, value)
                batches.append([first, last, index, bytes(previous).hex(), bytes(head).hex()])
                if with_events and events_db is not None:
                    for seq in range(first, last + 1):
                        raw = txn.get(EV.U64.pack(seq), db=events_db)
                        if raw is not None:
                            events[str(seq)] = _plain(check.decode("events", EV.U64.pack(seq), raw))
        return {"batches": batches, "events": events, "more": more}


class Peer:
    """A running member's chain, read through its HTTP API (``--peer HOST:PORT``)."""

    def __init__(self, address: str, user: str, password: str, timeout: float = 30.0, group: int = 0) -> None:
        self.address = address
        self.base = f"http://{address}/api/raftmq/audit/chain"
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.headers = {"Authorization": f"Basic {token}"}
        self.timeout = timeout
        self.group = group  # issue 34: the Raft group whose chain is read (0: the metadata group's)

    def for_group(self, group: int) -> Peer:
        """The same member (address, credentials) read for another group's chain."""
        other = copy.copy(self)
        other.group = group
        return other

    def page(self, low: int, high: int, events: bool = False, limit: int = PAGE_LIMIT) -> dict:
        wanted = {"from": low, "to": high, "limit": limit, "events": int(events)}
        if self.group:
            wanted["group"] = self.group
        request = urllib.request.Request(f"{self.base}?{urllib.parse.urlencode(wanted)}", headers=self.headers)
        with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310 - http only, by design
            page = json.loads(response.read())
        if page.get("group", 0) != self.group:  # a member older than issue 34's chain per group
            raise ValueError(f"the peer answered with group {page.get('group', 0)}'s chain, not group {self.group}'s")
        return page

    def batches(self, low: int, high: int) -> dict[int, list]:
        out: dict[int, list] = {}
        while True:
            page = self.page(low, high)
            for batch in page["batches"]:
                out[batch[0]] = batch
            if not page["more"] or not page["batches"]:
                return out
            low = page["batches"][-1][0] + 1


def _compare_peer(h: _History, mine: list[Batch], peer: Peer, report: Report) -> None:
    """The batches this history and the running peer both hold: equal heads, else the first event
    that differs, named with its fields (the peer's records of that batch are fetched)."""
    if not mine:
        return
    theirs = peer.batches(mine[0].first, mine[-1].first + 1)
    where = f"than on the peer {peer.address}"
    for b in mine:
        o = theirs.get(b.first)
        if o is None:
            continue
        report.compared += 1
        if (o[1], o[3], o[4]) == (b.last, b.previous.hex(), b.head.hex()):
            continue
        their_events = peer.page(b.first, b.first + 1, events=True, limit=1)["events"]
        for seq in range(b.first, min(b.last, o[1]) + 1):
            mine_rec, their_rec = h.event(seq), their_events.get(str(seq))
            if mine_rec is None or their_rec is None:
                continue
            fields = _differences(cast(list, _plain(mine_rec)), their_rec)
            if fields:
                report.findings.append(Finding(seq, "events", f"differs {where}: {fields}"))
                break
        else:
            report.findings.append(Finding(b.first, CHAIN_TABLE, f"the batch of seqs {b.first}..{b.last} has "
                                                                 f"another head {where} (in an event one of the two "
                                                                 "did not keep, or in the chain record)"))


def verify_history(path: str, against: str | None = None, peer: Peer | None = None) -> Report:
    """Check the history at ``path`` (a live ``<data>/events`` or a snapshot) against its chain, and
    against the history at ``against`` if given."""
    report = Report(path)
    h = _History(path)
    other = _History(against) if against is not None else None
    try:
        report.first_seq, report.last_seq = h.info.first_seq, h.info.last_seq
        try:
            batches = h.batches(report.findings)
            if batches:
                report.head = batches[-1].head
            _check_batches(h, batches, report, other)
            _check_unchained(h, batches, report)
            if not batches and report.unchained:
                report.findings.append(Finding(None, CHAIN_TABLE, f"no chain records for {report.unchained} events "
                                                                  "(written before issue 36, or the chain was removed)"))
            if other is not None:
                _compare(h, batches, other, report)
            if peer is not None:
                _compare_peer(h, batches, peer, report)
            if (other is not None or peer is not None) and not report.compared:
                target = against if against is not None else peer.address if peer is not None else ""
                report.findings.append(Finding(None, CHAIN_TABLE, f"no batch in common with {target}: "
                                                                  "nothing could be compared"))
        except EV.HistoryDamaged as exc:
            report.findings.extend(Finding(None, d.where.split("/")[0], f"{d.where}: {d.what}") for d in exc.damages)
    finally:
        h.close()
        if other is not None:
            other.close()
    report.findings.sort(key=lambda f: (f.seq is None, f.seq or 0))
    return report


def history_path(snapshot: str | None, data_dir: str | None) -> str:
    if snapshot:
        return snapshot
    assert data_dir is not None
    return os.path.join(data_dir, "events")


def _resolve(path: str) -> str:
    """A data directory's history, or the path itself (a snapshot or an events directory)."""
    events = os.path.join(path, "events")
    return events if os.path.exists(os.path.join(events, "data.mdb")) else path


def main(args: argparse.Namespace) -> int:
    """Verify the history given and, for a node's data directory or snapshot with queue groups
    (issue 34), every group's: each on its own chain, against the same group of ``--against`` or
    of ``--peer``; one line per group, the worst exit status."""
    from .group_dirs import lone_group, queue_group_histories

    path = history_path(args.snapshot, args.data_dir)
    base = args.snapshot or args.data_dir
    against_base = getattr(args, "against", None)
    against = _resolve(against_base) if against_base else None
    for p in (path, against):
        if p is not None and not os.path.exists(os.path.join(p, "data.mdb")):
            print(f"raftmq audit verify: {p} holds no audit history", file=sys.stderr)
            return EXIT_USAGE
    peer = (Peer(args.peer, getattr(args, "peer_user", None) or "guest", getattr(args, "peer_password", None) or "guest")
            if getattr(args, "peer", None) else None)
    mine = dict(queue_group_histories(base))
    theirs = dict(queue_group_histories(against_base)) if against_base else {}
    # A lone group's history given (groups/g<N> of a snapshot): its place, or --group, names its
    # group for --peer.
    lone = 0 if mine else (getattr(args, "group", None) or lone_group(path))
    code = _verify_one(path, against, peer.for_group(lone) if peer is not None else None)
    for group in sorted(set(mine) | set(theirs)):
        if group not in mine or (against_base and group not in theirs):
            where, other = (mine[group], against_base) if group in mine else (theirs[group], base)
            print(f"NOT INTACT: {where}: first bad event: group {group}'s history has no counterpart in {other}")
            code = max(code, EXIT_BAD)
            continue
        code = max(code, _verify_one(mine[group], theirs.get(group),
                                     peer.for_group(group) if peer is not None else None))
    return code


def _verify_one(path: str, against: str | None, peer: Peer | None) -> int:
    """One history (one group's) verified and its line printed; its exit status."""
    try:
        report = verify_history(path, against, peer)
    except (lmdb.Error, EV.StoreDamaged) as exc:
        print(f"raftmq audit verify: {path}: cannot read the history: {exc}", file=sys.stderr)
        return EXIT_BAD
    except (OSError, ValueError) as exc:  # urllib's errors are OSErrors; a body that is not JSON
        address = peer.address if peer is not None else "?"
        print(f"raftmq audit verify: the peer {address} did not answer with its chain: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if report.findings:
        first = report.findings[0]
        print(f"NOT INTACT: {path}: first bad event: {first}")
        for finding in report.findings[1:20]:
            print(f"  also: {finding}")
        if len(report.findings) > 20:
            print(f"  ... and {len(report.findings) - 20} more")
        return EXIT_BAD
    compared = f"; {report.compared} batches identical in {against}" if against is not None else ""
    if peer is not None:
        group = f" (group {peer.group})" if peer.group else ""
        compared += f"; {report.compared} batches identical on the peer {peer.address}{group}"
    print(f"intact: {path}: {report.batches} batches, seqs {report.first_seq}..{report.last_seq}, "
          f"{report.events_checked} events checked, {report.not_kept} not kept (chained), "
          f"{report.unchained} older than the chain, {report.gaps_accepted} snapshot gaps, "
          f"head {report.head.hex()[:16] or '-'}{compared}")
    return EXIT_INTACT
