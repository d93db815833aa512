"""Engines execute a method's client and server functions: ``local`` in-process, ``flower`` through Flower."""
