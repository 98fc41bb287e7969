"""The consumer side: what runs a listener's members and feeds its handler.

- ``listener``: a ``@app.stream_listener`` declaration and its checks.
- ``runtime``: one coordinator member's heartbeat loop (``MemberRuntime``).
- ``member``: the member's protocol state machine (sans-IO, no clocks).
- ``lifecycle``: per-shard start/stop hooks (``ShardLifecycle``).
- ``poller``: the fair per-shard ``XREADGROUP`` reader and the handler calls.
- ``message``, ``handlers``: what a handler receives and the handler shapes.
- ``failure``, ``dead_letter``: the failure policy and the dead-letter stream.

Nothing is imported here: ``from streamkit import ...`` is the public surface.
"""
