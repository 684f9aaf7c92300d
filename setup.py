"""Package discovery for the two source roots.

`libs/hivemux` installs as `hivemux` and `services/<name>` as `hivemux.services.<name>`
(the `package-dir` mapping is in pyproject.toml). setuptools' automatic discovery cannot
combine two roots under one import name, so the package list is built here, plainly.
"""

from setuptools import find_packages, setup

library = find_packages("libs")
services = ["hivemux.services"] + [f"hivemux.services.{name}" for name in find_packages("services")]

setup(packages=library + services)
