"""``python -m streamkit_server``."""

import sys

from streamkit_server.cli import main

if __name__ == "__main__":
    sys.exit(main())
