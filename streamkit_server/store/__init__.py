"""Redis: the layout and key names, every Lua script, the group commit, mutexes and provisioning.

Import the submodules (``store.metadata``, ``store.keys`` ...): this package
imports nothing itself, so ``store.keys`` stays importable without redis-py.
"""
