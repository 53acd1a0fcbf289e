"""``python -m tests.history`` (from the repository's root): puts ``tests/`` on the path,
as pytest and the workers have it, and runs :mod:`history.cli` from there, so that the
package is imported once, as ``history``."""

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from history.cli import main

    sys.exit(main())
