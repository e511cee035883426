"""The AMQP 1.0 front end: a translation layer onto the broker core (see connection.py)."""
