"""AMQP 0-10 wire codec (no I/O): framing, the type system, controls, commands and structs."""
