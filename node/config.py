"""A node's configuration: every setting with its embedded default.

The schema lives with the node that reads it; how a configuration is assembled (defaults, a TOML
file, RAFTMQ_* environment variables, command-line flags) is the operations layer's job
(``ops/config.load_config``).  Every setting has a documented default so that ``raftmq server`` runs
with no configuration at all (listening on 127.0.0.1:5672, data under ./data/<node-id>).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

GROUPS_AUTOACK_SLICE = 2048  # Config.autoack_credit with queue groups (the tested setting, docs/benchmarks.md)


@dataclass
class UserConfig:
    password: str
    # vhost -> (configure, write, read) regular expressions, as RabbitMQ's permissions.
    permissions: dict[str, tuple[str, str, str]] = field(default_factory=lambda: {"/": (".*", ".*", ".*")})
    loopback_only: bool = False
    # RabbitMQ's user tags for the management APIs (ops/operator.py): administrator, monitoring,
    # policymaker, management.  None of them: an AMQP-only user.
    tags: list[str] = field(default_factory=list)


@dataclass
class MemberConfig:
    """One cluster member: its name, its Raft transport address and the address clients use."""

    node_id: str
    raft: str  # host:port
    amqp: str  # host:port


@dataclass
class Config:
    node_id: str = "n1"
    host: str = "127.0.0.1"
    port: int = 5672
    data_dir: str = ""  # default: ./data/<node_id>
    vhosts: list[str] = field(default_factory=lambda: ["/"])
    users: dict[str, UserConfig] = field(
        default_factory=lambda: {"guest": UserConfig("guest", loopback_only=True, tags=["administrator"])}
    )
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat: int = 60  # seconds offered in connection.tune; 0 disables
    max_message_size: int = 128 * 1024 * 1024
    # Messages x-delayed-message exchanges may hold at once (store/core/delayed.py); beyond it a delayed
    # publish is refused (basic.nack).  Decided while applying: every cluster member needs the same value.
    max_delayed_messages: int = 1_000_000
    # 0-9-1 consumers with prefetch >= 32: assign up to twice the prefetch, send as the client acks
    # (node/amqp091/window.py); the client never has more than its prefetch unacked.
    prefetch_readahead: bool = True
    max_connections: int = 10_000  # AMQP connections of all protocols, counted from the protocol header
    max_connections_per_address: int = 0  # ... from one source IP address; 0 = no limit
    # Seconds from accepting a socket to connection.open-ok (both protocols): a client that has not
    # opened its connection by then is closed.  0 disables (not advised: idle sockets hold slots).
    handshake_timeout: float = 10.0
    # Password checks (one PBKDF2 each, ~5 ms) run in this many threads, off the event loop; beyond
    # login_queue_limit logins hashing or waiting, a login is refused at once (node/logins.py).
    login_workers: int = 2
    login_queue_limit: int = 64
    # Refused client logins (wrong password...) are logged at most once per this many seconds, the
    # line saying how many were not logged in between (node/auth.py; a flood wrote a line each).
    login_refusal_log_interval: float = 1.0
    # AMQP 1.0 SASL ANONYMOUS (and 1.0 without SASL) logs in as this user; empty: not offered.
    amqp10_anonymous_user: str = ""
    # AMQP 1.0: a follower answers open with amqp:connection:redirect to the leader (node/amqp10/failover.py).
    amqp10_redirect_to_leader: bool = False
    # AMQP 1.0 open says product "RabbitMQ" version 4.2.0 (RabbitMQ 4's client libraries refuse others),
    # and a refused vhost closes the socket before open, as RabbitMQ 4 does (node/amqp10/connection.py).
    amqp10_rabbitmq_compat: bool = False
    # AMQP 1.0 transactions (node/amqp10/transactions.py): publishes and their body bytes the open
    # transactions of one connection may hold until their commits (they are in memory, and each commit
    # is one log entry), and undischarged transactions per connection.  Beyond: amqp:resource-limit-exceeded.
    amqp10_tx_max_messages: int = 10_000
    amqp10_tx_max_bytes: int = 16 * 1024 * 1024
    amqp10_tx_max_open: int = 64
    # AMQP 1.0 per-connection bounds (node/amqp10/limits.py), RabbitMQ 4's session_max_per_connection
    # and link_max_per_session with its defaults: announced as channel-max = sessions - 1 (2.7.1) and
    # handle-max = links - 1 (2.7.2); a channel or handle beyond is a framing-error.  Links of all
    # sessions of a connection together, and durable links (recovery.py) of one user kept in the
    # replicated state: beyond, the attach is refused with amqp:resource-limit-exceeded.
    amqp10_session_max: int = 64
    amqp10_link_max_per_session: int = 256
    amqp10_link_max_per_connection: int = 1024
    amqp10_durable_links_per_user: int = 256
    # /management replies (node/amqp10/management.py) a connection may hold for reply links without
    # credit, requests in flight included; beyond, the request link is detached (resource-limit-exceeded).
    amqp10_management_pending_max: int = 1000
    # AMQP 1.0 element budgets (protocol/amqp10/types.py): the items that the lists, maps and arrays of
    # one frame's performative, and of one message's header, annotations, properties and
    # application-properties together, may declare (~0.3 us and ~70 octets each to decode).  Beyond: a
    # frame is amqp:decode-error (connection closed), a message rejected with amqp:decode-error.  Message
    # bodies are never decoded (their octets are stored and forwarded), so no budget applies to them.
    amqp10_max_frame_elements: int = 4096
    amqp10_max_message_elements: int = 65536
    # A pre-settled 1.0 receiver (snd-settle-mode settled) gets its client's credit passed to the core
    # in slices of at most this many deliveries beyond what it has written -- fewer when its recent
    # message sizes fit fewer into write_buffer_high, at least 4 -- topped up as deliveries are written
    # (node/amqp10/links.py): the core forgets a pre-settled message once assigned, so credit for a
    # backlog would otherwise pull all of it, bodies included, into the node's memory at once.
    amqp10_presettled_slice: int = 256
    # A 0-9-1 auto-ack consumer (basic.consume no-ack) is given message credit by its channel in
    # slices of at most this many deliveries beyond what it has written -- fewer when its recent
    # message sizes fit fewer into write_buffer_high, at least 4 (node/amqp091/autoack.py): an
    # auto-ack message leaves its queue when assigned, so a backlog is not pulled into memory.
    # 0 (the default) turns it off: it cost ~12% on the publish->delivery round trip of an auto-ack
    # consumer (docs/benchmarks.md, issue 31), cause not located yet; and it must stay 0 during a
    # rolling upgrade from a version without it (replicas would differ).  2048 is the tested setting.
    # With queue groups 0 means 2048 (``autoack_credit``, issue 34).
    autoack_slice: int = 0
    # Bytes the node holds for clients: message bodies in memory (cache and write-behind), client
    # write buffers, parked auto-ack deliveries, publishes being received (node/broker.py
    # memory_in_use).  Queued bodies live on disk (<data>/bodies): a backlog does not count.
    memory_high_watermark: int = 1024 * 1024 * 1024
    # Message bodies (store/disk/bodies.py): memory for bodies read back from disk for consumers, and
    # bodies kept in memory before they are written (a body acked before that is never written).
    body_cache_bytes: int = 256 << 20
    body_write_behind_bytes: int = 16 << 20
    # The scrubbers re-read and verify what is stored at this rate each, repairing what they find:
    # stored bodies from a peer (store/disk/body_scrub.py), and in a cluster the Raft journal's records
    # and the snapshot (raft/scrub.py); 0 turns them off.
    scrub_bytes_per_second: int = 8 << 20
    disk_free_limit: int = 50 * 1024 * 1024
    # Resource alarms are re-evaluated as memory and disk use grow (after batches of outputs and
    # submitted commands), at most once per this many seconds, besides the once-a-second check.
    resource_check_interval: float = 0.02
    # A client's socket write buffer above this stops deliveries to its connection until it drains
    # to a quarter of it (pause_writing / resume_writing, node/writeflow.py); 0: asyncio's 64 KiB.
    write_buffer_high: int = 1 << 20
    use_uvloop: bool = True
    # Run the node's threads under Linux SCHED_BATCH: their many short wake-ups (every Raft message
    # and batch) then do not preempt other busy processes on the same cores.  For a node sharing
    # cores with CPU-bound clients; costs latency when the cores are saturated (docs/benchmarks.md).
    sched_batch: bool = False
    log_level: str = "INFO"
    log_format: str = "text"  # or "json": one object per line (ops/logs.py)
    metrics_port: int = 0  # Prometheus /metrics on host:metrics_port; 0 disables
    # Connections the metrics port keeps at once (ops/metrics_server.py; beyond: 503, closed); it shares
    # http_header_timeout, http_idle_timeout and fd_reserve with the HTTP API's listener.
    metrics_max_connections: int = 32
    # Message history in <data>/events (store/disk/event_writer.py): none (off), metadata, body.  A queue's
    # x-audit-retention argument and audit_vhosts ({vhost = retention}) override it where history is on.
    audit_retention: str = "none"
    audit_vhosts: dict[str, str] = field(default_factory=dict)
    audit_max_age: float = 0.0  # seconds of history kept (by event time); 0 = no limit
    audit_max_bytes: int = 0  # bytes of events + messages kept; 0 = no limit
    admin_port: int = 0  # gRPC admin service (ops/proto/admin.proto) on host:admin_port; 0 disables
    # RabbitMQ's HTTP management API (ops/http/) on host:http_port (RabbitMQ uses 15672); 0 disables.
    # Served over TLS with http_tls_cert/http_tls_key.
    http_port: int = 0
    http_tls_cert: str = ""
    http_tls_key: str = ""
    # HTTP listener bounds (ops/http/listener.py, issue 31): a connection must send its first request's
    # headers within http_header_timeout seconds (and a TLS handshake within it); an idle keep-alive
    # connection, or one sending a later request's headers, is closed after http_idle_timeout.
    # Beyond http_max_connections concurrent HTTP connections a new one gets 503 and is closed.
    http_header_timeout: float = 10.0
    http_idle_timeout: float = 60.0
    http_max_connections: int = 512
    # Request bodies: larger than http_max_body bytes -> 413 (RabbitMQ: management.http.max_body_size,
    # 20 MB); a JSON body of more than http_max_json_elements values (counted as commas and opening
    # brackets before parsing, an over-estimate) -> 413 too: parsed, each value costs ~32-80 bytes.
    http_max_body: int = 20 << 20
    http_max_json_elements: int = 2_000_000
    # File descriptors kept free for AMQP logins: the HTTP listener refuses connections while fewer than
    # this many remain below RLIMIT_NOFILE (whose soft limit the node raises to the hard one at start:
    # node/descriptors.py).  At most half the limit is reserved.
    fd_reserve: int = 256
    admin_tls_cert: str = ""  # PEM files: serve the admin API over TLS instead of plaintext
    admin_tls_key: str = ""
    # The admin port's sockets: seconds to finish the HTTP/2 handshake, seconds a connection without
    # a call is kept, and connections at once (beyond, new ones are refused) -- ops/admin.py.
    admin_handshake_timeout: float = 5.0
    admin_idle_timeout: float = 120.0
    admin_max_connections: int = 64
    tls_port: int = 0  # AMQP over TLS (amqps, usually 5671) besides the plain port; 0 disables
    tls_cert: str = ""  # PEM certificate chain of the node
    tls_key: str = ""  # PEM private key
    tls_ca: str = ""  # PEM CA bundle to verify client certificates (optional)
    tls_verify_peer: bool = False  # with tls_ca: require a client certificate
    # Cluster: empty `cluster` runs a single node with its local log. Otherwise this node is the
    # member whose node_id matches, and the secret authenticates and encrypts the Raft transport.
    cluster: list[MemberConfig] = field(default_factory=list)
    cluster_secret: str = ""
    cluster_secret_file: str = ""
    snapshot_entries: int = 20_000  # Raft entries between snapshots (each entry is a batch)
    snapshot_seconds: float = 600.0
    # ... or once the journal holds this many bytes on disk (bounds disk use and restart replay);
    # like RabbitMQ's Ra WAL, which rolls over at 512 MB.  0: by entries and time only.
    snapshot_bytes: int = 256 << 20
    node_down_after: float = 5.0  # the leader declares an unreachable member down after this
    # Close clients with 320 after this long without a leader (a leader cut off from the majority
    # steps down after 1 s), so that they fail over to the majority instead of waiting.
    leaderless_close_after: float = 1.5
    # Heartbeat period of an idle leader.  New entries and new commit indexes go out at once (not
    # on this timer), so it only bounds how fast followers notice a dead leader: 50 ms is a fifth
    # of the shortest election timeout.  10 ms heartbeats plus a 5 ms tick cost each idle node
    # 6-8 % of a core (measured); 50 ms and 20 ms cost 2-3 %.
    raft_append_entries_period: float = 0.05
    raft_batch_append_entries: bool = False  # pysyncobj's timer-batched AppendEntries (higher latency)
    # Largest AppendEntries message.  An entry (one group-commit batch) above pysyncobj's default of
    # 64 KiB is sent in chunks, one follower round trip each, and reassembled by quadratic
    # concatenation: 4 KB messages under load ran 4-5x slower than 256 B ones.
    raft_message_bytes: int = 4 << 20
    raft_leader_fallback: float = 1.0  # a leader hearing from no majority this long steps down
    raft_pre_vote: bool = True  # ask for pre-votes before raising the term (raft/prevote.py)
    raft_batch_bytes: int = 1 << 20  # a group-commit batch (one Raft entry) is cut at this size
    # While a batch is in flight, the next is proposed before the first commits only if it carries
    # this much (raft/cluster.py: a batch's fixed cost on every node is CPU taken from clients).
    # 64 KiB rather than 16: the nodes' CPU per confirmed publish fell ~9 % (docs/design.md).
    raft_pipeline_min_bytes: int = 64 << 10
    # A small batch with a command someone waits for is proposed while fewer than this many
    # batches are in flight (raft/cluster.py); beyond it, it waits for the first to commit.
    raft_urgent_in_flight: int = 2
    # How long a batch of deferrable commands only (acks of consumers with read-ahead to spare,
    # publishes of publishers with several unconfirmed) waits for other commands before it is
    # proposed; 0 proposes at once.
    raft_defer_seconds: float = 0.002
    # Commands waiting to be proposed beyond this many bytes stop the reading of publishers
    # (TCP back-pressure) until half of it is proposed: memory stays bounded under a flood.
    raft_backlog_bytes: int = 16 << 20
    # The Raft thread's longest sleep; any message or proposal wakes it at once.
    raft_tick_period: float = 0.02
    # Experiment (issue 30, raft/loop_tick.py): pysyncobj ticks in the node's asyncio loop instead
    # of a thread of its own (no cross-thread hand-offs; the journal's fsync then blocks the loop).
    raft_in_loop: bool = False
    raft_election_timeout_min: float = 0.25  # 0.15 s saw spurious elections on a loaded 2-core CI machine
    raft_election_timeout_max: float = 0.5
    # Sockets on the Raft port that have not proved the cluster secret (the first sealed frame of
    # the handshake) are closed after raft_handshake_timeout seconds, and at most
    # raft_max_unauthenticated are kept: the oldest goes for a new one (raft/gate.py).  A connection
    # stalled in the middle of a frame (no byte for raft_frame_stall_timeout) is closed too.
    raft_handshake_timeout: float = 5.0
    raft_max_unauthenticated: int = 64
    raft_frame_stall_timeout: float = 30.0
    # Issue 30's stage tracer (raftmq/trace.py): stamp each stage of every batch's way from a client
    # socket through Raft to the delivery write, into a ring of the newest trace_stages_events events,
    # written to <data>/trace.msgpack on SIGUSR2 and at stop (bench/latency_stages.py reads it).  A
    # cluster only.  Off: no hook is installed at all.
    trace_stages: bool = False
    trace_stages_events: int = 20_000
    # Issue 34 (node/groups.py, docs/design.md "Sharded Raft groups"): the number of Raft groups,
    # the metadata group and raft_groups - 1 queue groups, each a Raft log of its own in a worker
    # process of its own (the GIL makes a process one core).  1: one log, today's broker.  Every
    # member needs the same value.  Group g's Raft port is the member's raft port + g x
    # raft_group_port_step; its data lives in <data_dir>/groups/g<g>.
    raft_groups: int = 1
    raft_group_port_step: int = 100
    # With raft_groups > 1 in a cluster: seconds after this node starts leading the metadata group,
    # or after a member comes or goes, before it spreads the groups' leaders over the live members
    # (node/rebalancer.py, node/leader_spread.py).  0: never on its own (`raftmq cluster rebalance`).
    leader_rebalance_seconds: float = 5.0
    # Set by the node for its worker processes, not in configuration files: the group this process
    # applies (0: the node's main process, the metadata group and the client connections).
    group: int = 0

    def resolved_data_dir(self) -> str:
        return self.data_dir or os.path.join("data", self.node_id)

    @property
    def autoack_credit(self) -> int:
        """The auto-ack credit slice in effect (node/amqp091/autoack.py): ``autoack_slice``; with
        queue groups 2048 when it is 0.  There the stop through the log (Op.FLOW) reaches a queue
        group's worker behind the publishes already in its log, so an auto-ack consumer that stopped
        reading was assigned a whole burst (2,410 of 3,200 x 64 KiB, against 128 with one group);
        and a cluster with groups has no older replica to differ from (the rolling-upgrade reason)."""
        if self.autoack_slice or self.raft_groups <= 1:
            return self.autoack_slice
        return GROUPS_AUTOACK_SLICE

    def for_group(self, group: int) -> Config:
        """This node's configuration for the worker process of queue group ``group``: its own data
        directory under this one's, the members' Raft ports moved by ``group`` steps."""
        if not 0 < group < self.raft_groups:
            raise ValueError(f"group {group} is not a queue group of {self.raft_groups} groups")
        step = group * self.raft_group_port_step
        members = []
        for m in self.cluster:
            host, port = m.raft.rsplit(":", 1)
            members.append(MemberConfig(m.node_id, f"{host}:{int(port) + step}", m.amqp))
        return replace(self, group=group, cluster=members,
                       data_dir=os.path.join(self.resolved_data_dir(), "groups", f"g{group}"))

    @property
    def clustered(self) -> bool:
        return bool(self.cluster)

    def member(self, node_id: str | None = None) -> MemberConfig:
        wanted = node_id or self.node_id
        for m in self.cluster:
            if m.node_id == wanted:
                return m
        raise ValueError(f"node {wanted!r} is not a member of the configured cluster")

    def secret(self) -> str:
        if self.cluster_secret:
            return self.cluster_secret
        if self.cluster_secret_file:
            with open(self.cluster_secret_file) as fh:
                return fh.read().strip()
        raise ValueError("a cluster needs cluster_secret or cluster_secret_file (it encrypts Raft traffic)")
