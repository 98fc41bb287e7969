"""``streamkit demo``: a guided run on private Redis and coordinator processes.

Kept apart from the library: it starts launchers from ``streamkit.testing``
and prints to the terminal; an app never imports it.
"""
