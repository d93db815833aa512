"""Adapter building blocks PEFT lacks, and the client statistics several methods read."""

from fedpeft.adapters.statistics import feature_statistics

__all__ = ["feature_statistics"]
