"""The package's version, in a module that imports nothing (read by setuptools and doctor)."""

__version__ = "0.1.0"
