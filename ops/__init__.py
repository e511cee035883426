"""raftmq.ops"""
