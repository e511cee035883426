"""raftmq.protocol.amqp091"""
