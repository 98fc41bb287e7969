"""The orders sample: a billing listener and an invoice publisher, wired by DI."""
