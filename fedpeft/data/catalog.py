"""Importing this module imports (and so registers) every dataset builder in ``fedpeft.core.registry.DATASETS``.

It is never needed to find a dataset: the names, descriptions and modules are declared in
:mod:`fedpeft.catalog.datasets`, and ``DATASETS.get(name)`` imports the builder's module on first use. Import this
module only to load every builder at once.
"""

from fedpeft.data import files, real, synthetic  # noqa: F401
