"""AMQP 1.0 (OASIS): the type system, performatives, message sections and frames; codecs only, no I/O."""
