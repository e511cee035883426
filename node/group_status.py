"""Every Raft group of this node as this node sees it (issue 34): status.json's ``group_status``,
/api/nodes' ``raft.groups``, the metrics' ``group`` label.

Group 0 is the main process's own log; queue group ``g``'s replica is a worker process that writes
``<data>/groups/g<g>/status.json`` twice a second (node/status.py, the same writer as the node's).
The main process reads those files rather than asking over the link: they are on the same node,
already written, cost nothing on the link (whose frames and hot path the hop's rewrite owns), and
a worker that is stuck shows as a stale ``age`` instead of blocking whoever asks.  A file older
than STALE seconds, or missing, gives the group with ``role: "unknown"``.

``lag``: entries this replica has not applied of its own commit index; ``member_lags``: on a
group's leader, each follower's entries behind (the leader alone knows them).
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

from raftmq.store.core import queries as Q

from .group_leaders import group_address

if TYPE_CHECKING:
    from .broker import Broker

STALE = 3.0  # seconds: a worker writes every 0.5 s; older than this, its view is not trusted


def _read(path: str) -> dict | None:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def node_of_group_raft(broker: Broker, group: int, address: str | None) -> str | None:
    """The node id whose group-``group`` Raft port is ``address`` (configured members)."""
    if not address:
        return None
    step = broker.config.raft_group_port_step
    for member in broker.config.cluster:
        if group_address(member.raft, group, step) == address:
            return member.node_id
    return None


def group_views(broker: Broker) -> list[dict]:
    """One dict per group of this node, group 0 first: role, term, commit and applied index, lag,
    leader (node id), and for queue groups the worker's pid and the age of what it last wrote."""
    config = broker.config
    log = broker.log
    raft = log.raft_status()
    if raft is None:
        applied = Q.counters(broker.machine).applied_index
        views = [{"group": 0, "role": "single", "term": 0, "commit_index": applied, "applied_index": applied,
                  "lag": 0, "leader": config.node_id, "member_lags": {}}]
    else:
        views = [{"group": 0, "role": "leader" if log.is_leader else "follower", "term": raft.term,
                  "commit_index": raft.commit_index, "applied_index": raft.applied_index,
                  "lag": max(0, raft.commit_index - raft.applied_index),
                  "leader": broker.node_of_raft(log.leader),
                  "member_lags": {broker.node_of_raft(a) or a: n for a, n in raft.lags.items()}}]
    host = broker.group_host
    if host is None:
        return views
    data_dir = config.resolved_data_dir()
    now = time.time()
    for group, worker in sorted(host.workers.items()):
        st = _read(os.path.join(data_dir, "groups", f"g{group}", "status.json"))
        age = None if st is None else round(max(0.0, now - float(st.get("time", 0))), 3)
        view: dict = {"group": group, "pid": worker.process.pid, "age": age}
        if st is None or age is None or age > STALE or st.get("pid") != worker.process.pid:
            view.update(role="unknown", term=None, commit_index=None, applied_index=None, lag=None,
                        leader=None, member_lags={})
        else:
            commit = st.get("commit_index", st.get("applied_index"))
            applied = st.get("raft_applied", st.get("applied_index"))
            view.update(role=st.get("role"), term=st.get("term", 0), commit_index=commit,
                        applied_index=applied,
                        lag=max(0, commit - applied) if commit is not None and applied is not None else None,
                        leader=(node_of_group_raft(broker, group, st.get("leader")) if config.clustered
                                else config.node_id),
                        member_lags={node_of_group_raft(broker, group, a) or a: n
                                     for a, n in (st.get("member_lags") or {}).items()})
        views.append(view)
    return views
