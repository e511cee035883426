"""raftmq: a clustered AMQP message broker with Raft-replicated state in LMDB."""

__version__ = "0.1.0"
