"""Stage 4: the children's results merged into tables, plots, comparisons and history."""
