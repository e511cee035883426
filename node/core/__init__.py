"""The protocol-independent layer every front end uses between its wire methods and the broker core.

Importing it registers every protocol's message property codec with the core (formats.py).
"""

from . import formats as formats
