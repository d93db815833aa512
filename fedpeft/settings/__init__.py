"""The typed settings of methods and of the server step, importable without torch.

:mod:`fedpeft.settings.server` holds the server step's settings (``dp``, ``aggregation``, ``server_optimizer``,
``merge``), :mod:`fedpeft.settings.methods` every method's ``Config`` and the bases and family configs they build
on. They import pydantic, the standard library and :mod:`fedpeft.core` only, so that ``core.config`` checks a
config (a misspelt key, a value out of range, a server rule a method cannot apply) before torch is imported. A
method module imports its ``Config`` from here (``from fedpeft.settings.methods import XConfig``), which is how the
method catalogue (:mod:`fedpeft.catalog.methods`) names it without importing the method.
"""
