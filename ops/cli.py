"""The `raftmq` command line."""

from __future__ import annotations

import argparse
import logging
import sys

from .config import load_config


def _server(args: argparse.Namespace) -> int:
    from raftmq.node.server import run

    config = load_config(args.config, {
        "node_id": args.node_id,
        "host": args.host,
        "port": args.port,
        "data_dir": args.data_dir,
        "use_uvloop": False if args.no_uvloop else None,
        "log_level": args.log_level,
        "log_format": args.log_format,
        "metrics_port": args.metrics_port,
        "admin_port": args.admin_port,
        "http_port": args.http_port,
        "tls_port": args.tls_port,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
    })
    from .logs import configure

    configure(config.log_level, config.log_format, config.node_id)
    from .services import services_for

    run(config, services_for(config))
    return 0


def _cluster_up(args: argparse.Namespace) -> int:
    from .cluster_up import cluster_up

    return cluster_up(args.nodes, args.host, args.amqp_base_port, args.raft_base_port, args.data_dir,
                      args.log_level, metrics_base=args.metrics_base_port, admin_base=args.admin_base_port,
                      http_base=args.http_base_port)


def _cluster_admin(args: argparse.Namespace) -> int:
    from . import cluster_admin

    config = load_config(args.config, {})
    if args.cluster_command == "status":
        cluster_admin.print_json(cluster_admin.status(config, args.via))
    elif args.cluster_command == "rebalance":
        done = cluster_admin.rebalance(config, args.to, args.group, args.timeout)
        cluster_admin.print_json(done)
        return 1 if done["failed"] else 0
    else:
        print(cluster_admin.change(config, args.cluster_command, args.raft, args.via))
    return 0


def _snapshot(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    import os

    from raftmq.store.disk.history import snapshot

    from .group_dirs import queue_group_histories

    source = os.path.join(args.data_dir, "events")
    if not os.path.exists(os.path.join(source, "data.mdb")):
        print(f"raftmq snapshot: {source} holds no history (is audit_retention set?)", file=sys.stderr)
        return 2
    info = snapshot(source, args.out)
    out = {"snapshot": args.out, **dataclasses.asdict(info)}
    # Issue 34: each queue group keeps its own history (groups/g<N>/events, its own sequence);
    # its snapshot goes to <out>/groups/g<N>, beside the metadata group's.
    groups = {}
    for group, events in queue_group_histories(args.data_dir):
        groups[str(group)] = dataclasses.asdict(snapshot(events, os.path.join(args.out, "groups", f"g{group}")))
    if groups:
        out["groups"] = groups
    print(json.dumps(out))
    return 0



def _verify(args: argparse.Namespace) -> int:
    from .verify import main as verify

    return verify(args.data_dir, force=args.force)


def _chaos_run(args: argparse.Namespace) -> int:
    import tempfile

    from .chaos import backends, nemesis, runner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("pika").setLevel(logging.WARNING)
    if args.backend == "netns":
        if not backends.netns.available():
            print("raftmq chaos: the netns backend needs root and iproute2", file=sys.stderr)
            return 2
        nemeses = [n.strip() for n in args.nemesis.split(",")]
        damaging = any(n in nemesis.DAMAGE_NEMESES for n in nemeses)
        backend = backends.NetnsBackend(tempfile.mkdtemp(prefix="raftmq-chaos-"),
                                        small_disks=512 << 20 if "disk-full" in nemeses else 0,
                                        extra_config=nemesis.DAMAGE_CONFIG if damaging else "", groups=args.groups or None)
    else:
        damaging = any(n.strip() in nemesis.DAMAGE_NEMESES for n in args.nemesis.split(","))
        environment = dict(nemesis.DAMAGE_ENVIRONMENT) if damaging else {}
        if args.groups > 1:  # (without --groups the containers' own environment decides)
            environment["RAFTMQ_RAFT_GROUPS"] = str(args.groups)
        backend = backends.ComposeBackend(args.compose_file, environment=environment or None)
    config = runner.RunConfig(duration=args.duration, nemeses=[n.strip() for n in args.nemesis.split(",") if n.strip()],
                              fault_seconds=args.fault_seconds, quiet_seconds=args.quiet_seconds, seed=args.seed,
                              out_dir=args.out, groups=max(args.groups, 1))
    result = runner.run_on_fresh(backend, config)
    r = result.report
    print(f"{'VALID' if result.valid else 'INVALID'}: {len(result.faults)} faults; confirmed {r['confirmed']} "
          f"({r['confirmed_by_kind']}), received {r['received']}, lost {r['lost_count']}, "
          f"damaged {r['damaged_count']}, "
          f"unexpected {len(r['unexpected'])}, duplicated 0-9-1 {len(r['duplicated']['0-9-1'])} "
          f"0-10 {len(r['duplicated']['0-10'])} 0-9-1-dedup {len(r['duplicated']['0-9-1-dedup'])} "
          f"(resent after a lost confirm: {r['dedup_resent']}), replicas identical {r['replicas_identical']}")
    if r["groups"] > 1:
        print(f"  {r['groups']} groups: queue groups' replicas identical {r['groups_identical']}, applied indexes "
              f"{r['group_applied']}; a killed node's "
              f"workers stopped in {max(r['worker_exit_seconds'], default=0):.2f} s at most "
              f"({len(r['worker_exit_seconds'])} kills), still running after: {len(r['worker_stragglers'])}")
    for item in r["availability"]:
        print(f"  {item['fault']}: longest time without a confirm {item['longest_gap_s']} s; "
              f"first confirm {item['first_confirm_after_s']} s after the heal")
    for key in ("damaged_examples", "fault_errors", "drain_errors", "node_exits", "worker_stragglers"):
        for item in r[key]:
            print(f"  {key}: {item}")
    if r["settle_error"]:
        print(f"  settle_error: {r['settle_error']}")
    print(f"report: {args.out}/report.json, timeline: {args.out}/timeline.png")
    return 0 if result.valid else 1


def _audit(args: argparse.Namespace) -> int:
    if args.job == "verify":  # the hash chain (issue 36): no Spark needed
        from .audit_verify import main as verify_chain

        # --snapshot/--data-dir repeat for the Spark jobs (several nodes as one table); verify
        # checks one history (and --against another).
        for name in ("snapshot", "data_dir"):
            given = getattr(args, name)
            if isinstance(given, list):
                if len(given) > 1:
                    print(f"raftmq audit verify checks one history: give one --{name.replace('_', '-')} and "
                          "--against for another", file=sys.stderr)
                    return 2
                setattr(args, name, given[0] if given else None)

        # Issue 34: a node's data directory (or a snapshot of it) is every group's history, each its
        # own chain: each is verified (and compared with --against/--peer's same group) and printed;
        # the worst exit status counts (ops/audit_verify.py main).
        return verify_chain(args)
    try:
        from raftmq.spark.report import run
    except ImportError as exc:
        print(f"raftmq audit needs Spark: pip install 'raftmq[spark]' ({exc})", file=sys.stderr)
        return 2
    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raftmq", description="raftmq: a clustered AMQP broker")
    sub = parser.add_subparsers(dest="command", required=True)
    server = sub.add_parser("server", help="run one broker node")
    server.add_argument("--config", help="TOML configuration file")
    server.add_argument("--node-id", help="node name (default n1)")
    server.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    server.add_argument("--port", type=int, help="AMQP port (default 5672)")
    server.add_argument("--data-dir", help="data directory (default ./data/<node-id>)")
    server.add_argument("--no-uvloop", action="store_true", help="use the stock asyncio loop")
    server.add_argument("--log-level", help="DEBUG, INFO, WARNING... (default INFO)")
    server.add_argument("--log-format", choices=["text", "json"], help="log lines as text (default) or JSON")
    server.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port (default off)")
    server.add_argument("--admin-port", type=int, help="serve the gRPC admin API on this port (default off)")
    server.add_argument("--http-port", type=int,
                        help="serve RabbitMQ's HTTP management API on this port (default off; RabbitMQ uses 15672)")
    server.add_argument("--tls-port", type=int, help="also serve AMQP over TLS on this port (default off)")
    server.add_argument("--tls-cert", help="PEM certificate chain for --tls-port")
    server.add_argument("--tls-key", help="PEM private key for --tls-port")
    server.set_defaults(func=_server)

    cluster = sub.add_parser("cluster", help="local cluster helpers")
    cluster_sub = cluster.add_subparsers(dest="cluster_command", required=True)
    up = cluster_sub.add_parser("up", help="start a local N-node cluster on loopback (default 3 nodes)")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--amqp-base-port", type=int, default=5672, help="first node's AMQP port (then +1...)")
    up.add_argument("--raft-base-port", type=int, default=4401, help="first node's Raft port (then +1...)")
    up.add_argument("--http-base-port", type=int, default=15672,
                    help="first node's HTTP management API port (RabbitMQ's 15672; then +1...; 0: off)")
    up.add_argument("--admin-base-port", type=int, default=15680,
                    help="first node's gRPC admin port (then +1...; 0: off)")
    up.add_argument("--metrics-base-port", type=int, default=15692,
                    help="first node's Prometheus port (then +1...; 0: off)")
    up.add_argument("--data-dir", default="data", help="parent of the nodes' data directories")
    up.add_argument("--log-level", default="INFO")
    up.set_defaults(func=_cluster_up)
    for name, help_text in (("status", "Raft status of a member (leader, term, indexes)"),
                            ("add", "add a started node to the Raft configuration"),
                            ("remove", "remove a member from the Raft configuration")):
        cmd = cluster_sub.add_parser(name, help=help_text)
        cmd.add_argument("--config", required=True, help="the cluster's TOML file (members, secret)")
        cmd.add_argument("--via", help="Raft address of the member to ask (default: the first that answers)")
        if name != "status":
            cmd.add_argument("--raft", required=True, help="the Raft address (host:port) of the node")
        cmd.set_defaults(func=_cluster_admin)
    # Issue 34: move the Raft groups' leaders (node/group_leaders.py).
    rebalance = cluster_sub.add_parser("rebalance", help="spread the Raft groups' leaders over the live "
                                       "members (or move them to one node) and print each group's leader")
    rebalance.add_argument("--config", required=True, help="the cluster's TOML file (members, secret)")
    rebalance.add_argument("--to", help="node id: move the groups' leaders to this node instead of spreading")
    rebalance.add_argument("--group", type=int, action="append",
                           help="with --to: only this group (repeatable; default every group)")
    rebalance.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for the moves")
    rebalance.set_defaults(func=_cluster_admin)

    snap = sub.add_parser("snapshot", help="consistent compact copy of a node's message history (running or not)")
    snap.add_argument("--data-dir", required=True, help="the node's data directory")
    snap.add_argument("--out", required=True, help="an empty directory for the copy")
    snap.set_defaults(func=_snapshot)

    verify = sub.add_parser("verify", help="check a stopped node's files for damage (exit 0 clean, 1 damaged, 2 usage)")
    verify.add_argument("--data-dir", required=True, help="the node's data directory")
    verify.add_argument("--force", action="store_true", help="check even if the node seems to be running")
    verify.set_defaults(func=_verify)

    audit = sub.add_parser("audit", help="audit a message history snapshot with Spark (pip install raftmq[spark])")
    audit.add_argument("job", choices=["summary", "unconsumed", "redelivered", "dead-letters", "latency",
                                       "throughput", "delays", "deduplicated", "trace", "contents", "verify"],
                       help="a Spark job, or verify: check the history against its hash chain (exit 0 intact, "
                            "1 not, naming the first bad event)")
    source = audit.add_mutually_exclusive_group(required=True)
    source.add_argument("--snapshot", action="append",
                        help="a snapshot directory (raftmq snapshot); repeat for several nodes' read as one")
    source.add_argument("--data-dir", action="append",
                        help="a node's data directory: snapshot its history first; repeat for several nodes")
    audit.add_argument("--message-id", help="trace: a raftmq message id, or an AMQP message-id property")
    audit.add_argument("--group", type=int, default=0,
                       help="trace: the Raft group whose message id --message-id is (queue groups; default 0); "
                            "verify --peer: the group of a lone group's history given as --snapshot")
    audit.add_argument("--queue", help="contents: the queue")
    audit.add_argument("--at", help="contents: the moment, UTC ISO-8601 ('2026-11-28 10:42:00')")
    audit.add_argument("--vhost", default="/", help="contents: the queue's vhost (default /)")
    audit.add_argument("--out", help="also write the whole result: NAME.csv, or Parquet (any other name)")
    audit.add_argument("--plot", help="also draw the result to this PNG file")
    audit.add_argument("--limit", type=int, default=50, help="rows printed (default 50)")
    audit.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    audit.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    audit.add_argument("--against", help="verify: also compare with another node's data directory or snapshot")
    audit.add_argument("--peer", help="verify: also compare with a running member's chain, HOST:PORT of its HTTP API")
    audit.add_argument("--peer-user", default="guest", help="verify --peer: a monitoring user (default guest)")
    audit.add_argument("--peer-password", default="guest", help="verify --peer: its password (default guest)")
    audit.set_defaults(func=_audit)

    chaos = sub.add_parser("chaos", help="fault-injection runs with a Jepsen-style checker")
    chaos_sub = chaos.add_subparsers(dest="chaos_command", required=True)
    chaos_run = chaos_sub.add_parser("run", help="workload + faults on a 3-node cluster, then check")
    chaos_run.add_argument("--backend", choices=["netns", "compose"], default="netns",
                           help="netns: node processes in network namespaces (root); compose: docker-compose.yml")
    chaos_run.add_argument("--duration", type=float, default=120.0, help="seconds of faults (default 120)")
    chaos_run.add_argument("--nemesis", default="kill,partition,pause,leader-kill",
                           help="comma-separated: kill, leader-kill, pause, partition, bridge, loss, restart-all, "
                                "disk-full, corrupt, truncate, corrupt-and-kill, truncate-and-kill")
    chaos_run.add_argument("--fault-seconds", type=float, default=4.0, help="how long each fault lasts")
    chaos_run.add_argument("--quiet-seconds", type=float, default=4.0, help="recovery time between faults")
    chaos_run.add_argument("--seed", type=int, default=1)
    chaos_run.add_argument("--groups", type=int, default=0,
                           help="raft_groups of every node (issue 34: the metadata group and N-1 queue groups; "
                                "default RAFTMQ_RAFT_GROUPS or 1)")
    chaos_run.add_argument("--out", default="chaos-run", help="directory for report.json, history, timeline.png")
    chaos_run.add_argument("--compose-file", default="docker-compose.yml")
    chaos_run.set_defaults(func=_chaos_run)

    from .admin_cli import add_parser as add_admin_parser

    add_admin_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
