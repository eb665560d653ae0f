"""What a run leaves behind: eval's figures, the result of a finished run, or the failure
of one that did not finish."""
