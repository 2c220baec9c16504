"""The judge: compares reconstructions with the ground truth that only the simulation holds."""
