"""raftmq.spark"""
