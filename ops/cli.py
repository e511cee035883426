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
    })
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    run(config)
    return 0


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
    server.set_defaults(func=_server)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
