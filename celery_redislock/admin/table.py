"""Plain-text tables that fit a terminal, as ``kubectl get`` prints them: columns two
spaces apart, and, when a row would be wider than the terminal, the cells of the
columns named to give way (the widest first) cut in the middle with ``…`` (``--wide``
prints them whole).

    >>> print("\\n".join(text_table(["NAME", "USED"], [["customer:1234567890abcdef", "1/2"]],
    ...                             width=20, shrink=[0])))
    NAME            USED
    customer…bcdef  1/2
"""

from __future__ import annotations

import shutil
from typing import List, Optional, Sequence

#: The narrowest a terminal is taken to be, and what is used when none is known (a pipe).
MIN_WIDTH, DEFAULT_WIDTH = 80, 120

#: The narrowest a column that gives way becomes.
MIN_COLUMN = 8

ELLIPSIS = "\u2026"


def terminal_width() -> int:
    """The width to fit: the terminal's (``COLUMNS`` when set), at least
    :data:`MIN_WIDTH`; :data:`DEFAULT_WIDTH` when output goes to no terminal."""
    return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, its start and end kept around ``…``.

        >>> clip("w1@host|1f6b2c8e-0d4a-4f7e-9b1a-3c5d7e9f1a2b", 20)
        'w1@host|1f6b…e9f1a2b'
    """
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    tail = (width - 1) * 2 // 5
    return text[:width - 1 - tail] + ELLIPSIS + (text[len(text) - tail:] if tail else "")


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], *,
               width: Optional[int] = None, shrink: Sequence[int] = ()) -> List[str]:
    """The lines of a table; with ``width``, the columns ``shrink`` names are narrowed,
    the widest first (down to :data:`MIN_COLUMN` or their header), until each line fits
    in ``width`` characters, or they can give no more."""
    lines = [list(header), *(list(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    if width is not None:
        excess = sum(widths) + 2 * (len(widths) - 1) - width
        floors = {column: max(MIN_COLUMN, len(header[column])) for column in shrink}
        while excess > 0:
            room = [(widths[c] - floors[c], -order, c) for order, c in enumerate(shrink)]
            spare, _, column = max(room, default=(0, 0, 0))
            if spare <= 0:
                break
            widths[column] -= 1
            excess -= 1
    return ["  ".join(clip(cell, size).ljust(size) for cell, size in zip(line, widths)).rstrip()
            for line in lines]
