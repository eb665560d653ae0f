"""Stage 1: the scenarios file, loaded once into typed objects and validated."""
