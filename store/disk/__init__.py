"""The state machine's storage: message bodies on disk, the single node's LMDB mirror, the audit
history, snapshots, and the fetching and scrubbing that keep them intact.

Everything that touches a file, a thread or a peer lives here; ``store/core/`` declares what it
needs and never imports this package.
"""
