"""Which link a client's attach (2.7.3) makes: the one module that knows every kind of link.

The kinds are subclasses of ``links.Link`` in modules of their own (management.py, recovery.py,
transactions.py), so the choice sits above all of them: links.py and session.py import none of
them, and the connection hands an attach here through ``Amqp10Connection.attach_link``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .limits import link_refusal
from .links import IncomingLink, Link, OutgoingLink
from .management import ManagementLink, is_management
from .recovery import DurableOutgoingLink, is_durable
from .transactions import CoordinatorLink, is_coordinator

if TYPE_CHECKING:
    from .session import Session


def attach_link(session: Session, attach) -> Link | None:
    """The link for a client's attach (None when refused: the refusal is already sent)."""
    refusal = link_refusal(session)
    if refusal is not None:  # limits.py: links of all sessions of the connection
        Link(session, attach)._refuse("amqp:resource-limit-exceeded", refusal)
        return None
    if is_management(attach):
        return ManagementLink(session, attach).attach()
    if is_coordinator(attach):  # 4.2 the transaction coordinator (transactions.py)
        return CoordinatorLink(session, attach).attach()
    if attach.role and is_durable(attach):
        return DurableOutgoingLink(session, attach).attach()
    if attach.role:  # the client is the receiver: we send
        return OutgoingLink(session, attach).attach()
    return IncomingLink(session, attach).attach()
