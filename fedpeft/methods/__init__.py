"""The methods fedpeft ships: one module per method (its class) and one beside it, ``<name>_config.py``, with its
settings; ``base.py`` holds the contract and ``families/`` the shared bases.

Importing this package imports nothing else, so a method's config module loads without torch. The registry
(``fedpeft.core.registry.METHODS``) imports a method's module the first time the method is asked for.
"""
