"""RabbitMQ's HTTP management API on a raftmq node (aiohttp, on the broker's event loop).

server.py starts it (a service of ops/services.py); common.py authenticates; resources.py,
system.py and users.py are the endpoints; views.py the JSON shapes; rates.py the sampled rates.
"""
