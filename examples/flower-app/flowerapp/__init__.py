"""flowerapp: a Flower app of its own (PyTorch on scikit-learn's digits), audited by fl-sim."""
