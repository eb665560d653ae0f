"""``tunematrix``: the command line, a thin layer over the library."""
