"""``aot.build`` (the package's old name) still gives the public names, with a DeprecationWarning naming the new home."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.parametrize("name", ["build", "BuildReport", "default_output"])
def test_the_old_name_warns_and_gives_the_new_object(name):
    import aot.builder

    old = importlib.import_module("aot.build")
    with pytest.warns(DeprecationWarning, match=rf"aot\.build\.{name} moved to aot\.builder\.{name}"):
        moved = getattr(old, name)
    assert moved is getattr(aot.builder, name)


def test_nothing_else_hides_behind_the_old_name():
    old = importlib.import_module("aot.build")
    with pytest.raises(AttributeError, match="has no attribute 'spine'"):
        old.spine
