"""Datasets of the simulated world."""
