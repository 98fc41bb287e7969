"""pytest plugin: see streamkit.testing.fixtures."""
