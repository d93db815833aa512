"""Importing this module registers every dataset builder in ``fedpeft.core.registry.DATASETS``."""

from fedpeft.data import real, synthetic  # noqa: F401
