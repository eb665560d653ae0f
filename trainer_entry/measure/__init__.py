"""What a run measures while it trains: the step clock, memory, FLOPs, profiles, the steady-state stop and progress."""
