"""Entry points at the top of fedpeft: the Flower apps (``flwr run .`` and ``fedpeft run --engine flower``)."""
