"""fl-sim: the simulated federation, the judge (audit) and the user interface."""
