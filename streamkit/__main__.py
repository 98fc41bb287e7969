"""``python -m streamkit``: the same as the ``streamkit`` command."""

from streamkit.cli import main

main()
