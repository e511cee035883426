"""raftmq.store"""
