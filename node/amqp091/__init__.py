"""The AMQP 0-9-1 front end: translates 0-9-1 methods into broker-core commands."""
