"""Build script: packaging metadata lives in pyproject.toml; this file drives CMakeLists.txt."""
from setuptools import setup

setup()
