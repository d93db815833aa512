"""Federated datasets: synthetic benchmarks, real loaders, partitioning into client pools."""

from fedpeft.data.types import ClientData, Example, FederatedData

__all__ = ["ClientData", "Example", "FederatedData"]
