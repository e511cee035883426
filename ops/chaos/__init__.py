"""Fault injection for raftmq clusters: network namespaces, nemeses, workloads and the history checker."""
