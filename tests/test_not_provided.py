"""TensorFlow names towerdist does not provide: an AttributeError that says what to use instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import towerdist as td
from towerdist._src import not_provided

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "migrating-tf2.md"

# (module, name, words the message must contain, the guide's section it points to)
CASES = [
    (td, "keras", "towerdist has no Keras", "keras-and-checkpoints"),
    (td, "GradientTape", "an autograd library that works on numpy/cupy arrays", "no-automatic-differentiation"),
    (td, "matmul", "call numpy or cupy directly (tf.matmul(x, w) is x @ w", "arrays-instead-of-tensors"),
    (td.nn, "relu", "tf.nn.relu(x) is np.maximum(x, 0)", "arrays-instead-of-tensors"),
    (td, "Session", "there are no graphs, sessions or placeholders", "tffunction-is-eager"),
]


@pytest.mark.parametrize(("module", "name", "words", "section"), CASES, ids=[c[1] for c in CASES])
def test_a_tensorflow_name_towerdist_lacks_says_what_to_use(module, name, words, section):
    with pytest.raises(AttributeError) as info:
        getattr(module, name)
    message = str(info.value)
    tf_name = "tf" + module.__name__.removeprefix("towerdist")
    assert message.startswith(f"module {module.__name__!r} has no attribute {name!r} ({tf_name}.{name}). ")
    assert words in message
    assert message.endswith(f"See docs/migrating-tf2.md#{section}.")
    assert info.value.name == name


@pytest.mark.parametrize(("module", "name"), [(c[0], c[1]) for c in CASES], ids=[c[1] for c in CASES])
def test_hasattr_and_getattr_with_a_default_still_work(module, name):
    assert not hasattr(module, name)
    assert getattr(module, name, "fallback") == "fallback"


def test_from_import_of_a_missing_name_is_an_import_error():
    with pytest.raises(ImportError, match="cannot import name 'keras'"):
        from towerdist import keras  # noqa: F401


def test_any_other_missing_name_points_at_the_guide():
    with pytest.raises(AttributeError) as info:
        td.no_such_thing  # noqa: B018
    assert str(info.value) == (
        "module 'towerdist' has no attribute 'no_such_thing'. towerdist provides TensorFlow's distribution API "
        "(tf.distribute, tf.data, variables, optimizers, metrics, checkpoints), not all of TensorFlow; if "
        "tf.no_such_thing is a TensorFlow name, see docs/migrating-tf2.md#what-changes for what to use instead."
    )


@pytest.mark.parametrize("name", ["__wrapped__", "_private"])
def test_private_and_dunder_names_get_the_plain_message(name):
    # Probes by copy, pickle, inspect and test runners: no advice, no guide.
    with pytest.raises(AttributeError) as info:
        getattr(td, name)
    assert str(info.value) == f"module 'towerdist' has no attribute {name!r}"


def test_other_modules_keep_the_plain_message():
    with pytest.raises(AttributeError) as info:
        td.compat.v1.no_such_thing  # noqa: B018
    assert str(info.value) == "module 'towerdist.compat.v1' has no attribute 'no_such_thing'"


def test_the_names_towerdist_provides_are_not_in_the_table():
    for module_name, table in not_provided._TABLE.items():
        module = td if module_name == "towerdist" else td.nn
        provided = sorted(name for name in table if name in vars(module))
        assert provided == [], f"{module_name} provides {provided}; remove them from not_provided._TABLE"


def _sections() -> set[str]:
    slugify = pytest.importorskip("markdown.extensions.toc").slugify
    headings = re.findall(r"^#+ (.+)$", GUIDE.read_text(), flags=re.MULTILINE)
    return {slugify(heading, "-") for heading in headings}


def test_every_section_the_messages_name_is_a_heading_of_the_guide():
    named = {section for table in not_provided._TABLE.values() for section, _ in table.values()}
    assert named >= {"keras-and-checkpoints", "no-automatic-differentiation", "arrays-instead-of-tensors"}
    assert (named | {"what-changes"}) <= _sections()
