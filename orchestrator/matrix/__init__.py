"""Stage 2: scenarios expanded into experiments (``expand``), their ids, and the plan table."""
