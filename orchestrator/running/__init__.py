"""Stage 3: a plan run through an executor: the results folder, the order, progress and ETA."""
