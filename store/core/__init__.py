"""The broker's state machine, pure: the model, the typed commands, apply and its effects.

Nothing here does I/O, reads a clock or draws a random number: the same commands in give the same
state and the same effects out on every node (docs/design.md "The state machine").  What the
effects ask for (LMDB records, bodies, audit events) is carried out by ``store/disk/`` through the
applier.
"""
