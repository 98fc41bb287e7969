"""The protocol simulation's coverage lines are printed by ``tests/conftest.py``
(which also collects them from xdist workers)."""
