"""raftmq.node"""
