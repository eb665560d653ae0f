"""Inside one job, on whatever executor: the launch command, the memory sidecar, the time limit
and the status of what the child left behind.
"""
