"""``td.Module``: the order of ``variables``/``trainable_variables``/``submodules``, as TensorFlow 2.21 lists them.

The expected lists are what the same classes gave with ``tf.Module`` in TensorFlow 2.21: a
module's own variables first (attributes by name; lists in order, dicts by key), then each
sub-module's, sub-module by sub-module, recursively; anything reachable twice once.
"""

from __future__ import annotations

import numpy as np

import towerdist as td


class Leaf(td.Module):
    def __init__(self, tag: str) -> None:
        super().__init__(name=tag)
        self.v = td.Variable(1.0, name=tag + "_v")


class Inner(td.Module):
    def __init__(self, tag: str) -> None:
        super().__init__(name=tag)
        self.z = td.Variable(1.0, name=tag + "_z")
        self.deep = Leaf(tag + "_deep")


class Outer(td.Module):
    def __init__(self) -> None:
        super().__init__(name="outer")
        self.a = td.Variable(1.0, name="a")
        self.b = Inner("b")
        self.c = td.Variable(1.0, name="c")
        self.d = [td.Variable(1.0, name="d0"), Leaf("dleaf"), {"y": td.Variable(1.0, name="dy"), "x": td.Variable(1.0, name="dx")}]
        self.e = Leaf("e")


def test_own_variables_come_before_the_submodules_as_in_tensorflow() -> None:
    model = Outer()
    # TF 2.21: ['a:0', 'c:0', 'd0:0', 'dx:0', 'dy:0', 'b_z:0', 'b_deep_v:0', 'dleaf_v:0', 'e_v:0']
    assert [v.name for v in model.trainable_variables] == [
        "a:0", "c:0", "d0:0", "dx:0", "dy:0", "b_z:0", "b_deep_v:0", "dleaf_v:0", "e_v:0",
    ]  # fmt: skip
    # TF 2.21: ['b', 'dleaf', 'e', 'b_deep']
    assert [m.name for m in model.submodules] == ["b", "dleaf", "e", "b_deep"]


def test_a_variable_or_module_reachable_twice_is_listed_once() -> None:
    class Holder(td.Module):
        def __init__(self, v: td.Variable) -> None:
            super().__init__(name="leaf")
            self.v = v

    class Shared(td.Module):
        def __init__(self) -> None:
            super().__init__(name="m")
            shared = td.Variable(1.0, name="shared")
            self.a = self.b = shared
            self.c = self.d = Holder(shared)
            self.t = td.Variable(2.0, name="t", trainable=False)

    model = Shared()
    # TF 2.21: variables ['shared:0', 't:0'], trainable ['shared:0'], submodules ['leaf']
    assert [v.name for v in model.variables] == ["shared:0", "t:0"]
    assert [v.name for v in model.trainable_variables] == ["shared:0"]
    assert [v.name for v in model.non_trainable_variables] == ["t:0"]
    assert [m.name for m in model.submodules] == ["leaf"]


def test_a_submodule_that_refers_back_to_its_parent_ends_the_walk() -> None:
    parent = Leaf("parent")
    child = Leaf("child")
    parent.child = child
    child.parent = parent
    assert [v.name for v in parent.variables] == ["parent_v:0", "child_v:0"]
    assert parent.submodules == (child,)


def test_gradients_pair_with_trainable_variables_in_that_order() -> None:
    class Dense(td.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = td.Variable(np.zeros(2), name="w")
            self.b = td.Variable(np.zeros(1), name="b")

    class Model(td.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = td.Variable(np.zeros(3), name="scale")
            self.hidden = Dense()

    model = Model()
    shapes = [v.shape for v in model.trainable_variables]
    assert shapes == [(3,), (1,), (2,)]  # TF: scale, then hidden's b, w
    optimizer = td.optimizers.SGD(1.0)
    optimizer.apply_gradients(zip([np.ones(s) for s in shapes], model.trainable_variables))
    assert model.scale.numpy().tolist() == [-1.0, -1.0, -1.0]
