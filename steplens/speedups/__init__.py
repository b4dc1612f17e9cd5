"""The candidate fixes: each wraps a part of train.py's plain step; all are off by default (the tutorial's workload)."""
