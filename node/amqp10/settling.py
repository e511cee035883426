"""How a 1.0 connection batches client settlements to the core (its own module so that the
connection, which flushes the batches, and the links, which fill them, share it without importing
each other).

Settlements (client dispositions) go to the core in batches: each MESSAGE_SETTLE is a log entry, and
proton sends a disposition per message, read ~30 at a time.  A batch goes once it holds
SETTLE_BATCH settlements or SETTLE_DELAY after the first; a client's settlement is final when it
sends it (first mode), so the delay only keeps the message unacked in the core a little longer.
"""

SETTLE_BATCH = 256
SETTLE_DELAY = 0.005
