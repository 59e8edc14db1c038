"""Build shim: metadata is in pyproject.toml; this only adds the optional Cython extension."""

from setuptools import setup

from setup_cython import setup_kwargs

setup(**setup_kwargs())
