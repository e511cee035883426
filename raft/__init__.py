"""raftmq.raft"""
