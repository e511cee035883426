"""Node configuration: defaults embedded in the schema (node/config.py), overridden by a TOML file,
then env vars, then flags.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import fields

from raftmq.node.config import Config, MemberConfig, UserConfig

__all__ = ["Config", "MemberConfig", "UserConfig", "load_config"]


_ENV_PREFIX = "RAFTMQ_"


def _tags(value) -> list[str]:
    """Tags as a list or, as rabbitmqctl and the HTTP API write them, one comma-separated string."""
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    return [str(t) for t in value]


def load_config(path: str | None = None, overrides: dict | None = None) -> Config:
    """Defaults <- TOML file <- RAFTMQ_* environment variables <- explicit overrides (CLI flags)."""
    values: dict = {}
    if path:
        with open(path, "rb") as fh:
            values.update(tomllib.load(fh))
    scalar = {f.name: f.type for f in fields(Config)
              if f.name not in ("users", "vhosts", "cluster", "audit_vhosts", "group")}
    for name in scalar:
        env = os.environ.get(_ENV_PREFIX + name.upper())
        if env is not None:
            values[name] = env
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    config = Config()
    for key, value in values.items():
        if key == "users":
            config.users = {
                name: UserConfig(
                    password=spec["password"],
                    permissions={vh: tuple(p) for vh, p in spec.get("permissions", {"/": [".*"] * 3}).items()},
                    loopback_only=bool(spec.get("loopback_only", False)),
                    tags=_tags(spec.get("tags", [])),
                )
                for name, spec in value.items()
            }
        elif key == "vhosts":
            config.vhosts = list(value)
        elif key == "audit_vhosts":
            config.audit_vhosts = {str(k): str(v) for k, v in value.items()}
        elif key == "cluster":
            config.cluster = [MemberConfig(str(m["node_id"]), str(m["raft"]), str(m["amqp"])) for m in value]
        elif key in scalar:
            default = getattr(config, key)
            if isinstance(default, bool):
                value = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes")
            elif isinstance(default, int):
                value = int(value)
            elif isinstance(default, float):
                value = float(value)
            setattr(config, key, value)
        else:
            raise ValueError(f"unknown configuration key {key!r}")
    return config
