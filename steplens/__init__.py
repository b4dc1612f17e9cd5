"""steplens: read a PyTorch training trace, say what holds the step, and compare repeated runs honestly."""

__version__ = "1.0.0"
