"""Catalogues: every method, dataset and model fedpeft ships, declared without importing it.

Each module (:mod:`~fedpeft.catalog.methods`, :mod:`~fedpeft.catalog.datasets`, :mod:`~fedpeft.catalog.models`)
declares its registry's entries: the name, the module whose import registers the object, a one-line description
and the aliases. The registries of :mod:`fedpeft.core.registry` read their catalogue on first use, so
``fedpeft list`` and every name check answer from here; ``get`` imports the entry's module when it is needed.
These modules import nothing but the registry. tests/test_cli_fast.py checks that they agree exactly with the
``register`` calls of the modules they name.
"""
