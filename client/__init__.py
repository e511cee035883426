"""Clients for raftmq. ``raftmq.client.amqp010``: an asyncio AMQP 0-10 client with failover and session resume."""
