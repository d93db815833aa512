"""Rehearsal of a config on this machine: every phase of the run at its true shape with its compute cut, on a
stand-in model (the paper model's configuration with random weights) and, where the real data is not here,
generated stand-in data in the dataset's real layout."""
