"""Flower apps of the simulated federation (Message API)."""
