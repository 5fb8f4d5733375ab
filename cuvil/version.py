"""The package version, in a module of its own so every layer can name it without importing the
public facade (:mod:`cuvil`), which sits on top of everything."""

__version__ = "0.1.0"
