# cffi_modules can only be declared here; everything else is in pyproject.toml.
from setuptools import setup

setup(cffi_modules=["native/build_native.py:ffibuilder"])
