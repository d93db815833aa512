"""The typed settings of methods and of the server step, importable without torch.

:mod:`fedpeft.settings.server` holds the server step's settings (``dp``, ``aggregation``, ``server_optimizer``,
``merge``), :mod:`fedpeft.settings.methods` the config bases and family configs that every method's ``Config``
(in ``fedpeft/methods/<name>_config.py``, beside its method) builds on. They import pydantic, the standard library
and :mod:`fedpeft.core` only, and so does a method's config module, so that ``core.config`` checks a config (a
misspelt key, a value out of range, a server rule a method cannot apply) before torch is imported.
"""
