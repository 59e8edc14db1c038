"""Build shim: metadata is in pyproject.toml; this only adds the optional Cython extension."""

import os
import sys

from setuptools import setup

# PEP 517 builds do not put the project directory on sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from setup_cython import setup_kwargs

setup(**setup_kwargs())
