"""What a run measures while it trains: the step clock, memory, FLOPs, profiles, the
steady-state stop, progress, and the engine that trained."""
