"""How long ranks wait for each other."""

DEFAULT_TIMEOUT_S = 300.0
"""How long a collective waits for a peer before the process group gives up."""

RENDEZVOUS_TIMEOUT_S = 120.0
"""The least time ``spawn``'s ranks wait for each other to join the group."""
