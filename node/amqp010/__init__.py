"""The AMQP 0-10 front end: connections, sessions (with resume) and the translation to core commands."""
