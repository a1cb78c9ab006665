"""``towerdist._src.aliases``: registering old names (the old names themselves are tested in tests/compat/)."""

from __future__ import annotations

import warnings

import pytest

from towerdist._src import aliases


@pytest.fixture
def empty_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry of its own, so that the names a test registers do not join the real table."""
    monkeypatch.setattr(aliases, "_registered", [])
    monkeypatch.setattr(aliases, "_BY_OWNER", {})


def _old_function() -> int:
    """Returns 1."""
    return 1


def test_a_module_serves_and_lists_the_old_names_it_registers(empty_registry: None) -> None:
    alias = aliases.Alias("towerdist.planted.old", "towerdist.planted.new()", _old_function, "1.12")
    getattr_ = aliases.module_getattr("towerdist.planted", [alias])
    with pytest.warns(DeprecationWarning, match="towerdist.planted.old is a deprecated name"):
        assert getattr_("old") is _old_function
    assert aliases.module_dir("towerdist.planted", ["new"])() == ["new", "old"]
    assert aliases.all_aliases() == (alias,)


def test_an_old_name_of_another_module_is_refused(empty_registry: None) -> None:
    alias = aliases.Alias("towerdist.elsewhere.old", "towerdist.elsewhere.new()", _old_function, "1.12")
    with pytest.raises(ValueError, match=r"aliases.module_getattr\(\) serves the old names of one module"):
        aliases.module_getattr("towerdist.planted", [alias])


def test_an_old_name_registered_twice_with_another_replacement_is_refused(empty_registry: None) -> None:
    class Planted:
        pass

    aliases.install(Planted, [aliases.Alias("Planted.old", "Planted.new()", _old_function, "1.12", "method")])
    with pytest.raises(ValueError, match=r"Planted.old is registered twice in the alias table, as Planted.new\(\) and "):
        aliases.install(Planted, [aliases.Alias("Planted.old", "Planted.other()", _old_function, "1.12", "method")])


def test_an_old_name_registered_again_as_its_module_reloads_takes_the_new_target(empty_registry: None) -> None:
    first = aliases.Alias("towerdist.planted.old", "towerdist.planted.new()", _old_function, "1.12")
    aliases.module_getattr("towerdist.planted", [first])

    def reloaded() -> int:
        return 2

    again = aliases.Alias("towerdist.planted.old", "towerdist.planted.new()", reloaded, "1.12")
    getattr_ = aliases.module_getattr("towerdist.planted", [again])
    assert aliases.all_aliases() == (again,)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (warned once per process, maybe already)
        assert getattr_("old") is reloaded


def test_reloading_a_public_module_keeps_its_old_names() -> None:
    import importlib

    import towerdist.compat.v1 as v1

    before = {alias.old for alias in aliases.all_aliases()}
    importlib.reload(v1)
    assert {alias.old for alias in aliases.all_aliases()} == before
    assert v1.distribute.MirroredStrategy is not None
