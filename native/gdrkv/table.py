"""Plain-text tables for the command line."""


def format_table(rows):
    """rows (lists of str, the first one the header) as aligned lines: the
    first column left-aligned, the others (numbers) right-aligned."""
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) if col == 0 else cell.rjust(w)
                  for col, (cell, w) in enumerate(zip(row, widths))).rstrip()
        for row in rows)
