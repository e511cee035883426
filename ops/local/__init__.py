"""raftmq nodes as local OS processes: one node (``node.RaftmqNode``) or an N-node cluster
(``cluster.Cluster``, optionally in network namespaces).  Used by the tests, the benchmarks and
``raftmq chaos run --backend netns``."""
