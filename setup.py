"""Package discovery for the two source roots.

`libs/hivemux` installs as `hivemux` and `services/<name>` as `hivemux.services.<name>`
(the `package-dir` mapping is in pyproject.toml). setuptools' automatic discovery cannot
combine two roots under one import name, so the package list is built here, plainly.
"""

from setuptools import find_namespace_packages, find_packages, setup

# Namespace discovery also lists the folders that hold only package data (the console's assets,
# the migrations, the trace extracts), so setuptools knows them as packages and says nothing.
library = find_namespace_packages("libs", include=["hivemux", "hivemux.*"], exclude=["*.__pycache__"])
services = ["hivemux.services"] + [f"hivemux.services.{name}" for name in find_packages("services")]

setup(packages=library + services)
