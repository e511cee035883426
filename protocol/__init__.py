"""raftmq.protocol"""
