"""`requirements.lock` pins what pyproject.toml declares: a dependency added, removed or given a
range the lock's version falls outside of fails here until `make lock` is run."""

from __future__ import annotations

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from support.lockfile import declared_requirements, locked


def _declared() -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in declared_requirements()}


def test_every_declared_requirement_is_locked_at_a_version_it_admits() -> None:
    lock = locked()
    for name, requirement in _declared().items():
        assert name in lock, f"{requirement} is declared in pyproject.toml but not locked: run `make lock`"
        assert requirement.specifier.contains(lock[name].version, prereleases=True), (
            f"{requirement} does not admit the locked {lock[name].version}: run `make lock`"
        )


def test_the_lock_has_no_direct_requirement_pyproject_dropped() -> None:
    direct = {name for name, entry in locked().items() if "hivemux (pyproject.toml)" in entry.via}
    assert direct == set(_declared()), "pyproject.toml and the lock disagree: run `make lock`"


def test_every_locked_package_is_pinned_with_hashes() -> None:
    lock = locked()
    assert len(lock) > 50  # the whole environment, not only the direct requirements
    assert [name for name, entry in lock.items() if not entry.hashes] == []
