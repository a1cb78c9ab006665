"""``towerdist._src.aliases``: registering old names (the old names themselves are tested in tests/compat/)."""

from __future__ import annotations

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


def test_an_old_name_registered_twice_is_refused(empty_registry: None) -> None:
    alias = aliases.Alias("Planted.old", "Planted.new()", _old_function, "1.12", "method")

    class Planted:
        pass

    aliases.install(Planted, [alias])
    with pytest.raises(ValueError, match="Planted.old is registered twice in the alias table"):
        aliases.install(Planted, [alias])
