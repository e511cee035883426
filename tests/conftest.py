"""Every protocol's message property codec registered with the core, as a node registers them
(node/core/formats.py): unit tests drive the state machine without a node."""

import raftmq.node.core.formats  # noqa: F401
