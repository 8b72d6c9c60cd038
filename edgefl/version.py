"""The package's version: a leaf module, which edgefl re-exports and every run folder records."""

__version__ = "0.1.0"
