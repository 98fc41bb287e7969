"""The publishing side: ``Publisher`` and what keeps its routing fresh.

- ``publisher``: ``Publisher``, ``publish``/``publish_many`` and their errors.
- ``routing_cache``: the routing table's freshness rules (sans-IO).
- ``refresher``: the I/O loop that asks the coordinator for routing.
- ``coalescer``: concurrent publishes share one pipeline (group commit).

Nothing is imported here: ``from streamkit import ...`` is the public surface.
"""
