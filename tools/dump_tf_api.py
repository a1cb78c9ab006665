"""Writes the TensorFlow names towerdist promises, with their signatures, as JSON.

Run it in an environment with TensorFlow installed (CPU is enough)::

    python tools/dump_tf_api.py > tests/project/tf_distribute_api.json

It records every public name of ``tf.distribute``, ``tf.distribute.experimental`` and
``tf.distribute.cluster_resolver``, the public members of ``tf.distribute.Strategy``,
``StrategyExtended`` and ``ReplicaContext``, the members ``tf.compat.v1.distribute.StrategyExtended``
adds (TF 1.x leftovers that TF 2.x still ships), and the public members of the cluster
resolvers, ``tf.train.ClusterSpec`` and ``tf.data.Dataset`` (keyed by their full path, e.g.
``data.Dataset.batch``), ``tf.IndexedSlices`` (its constructor and public members) and the public
members of ``tf.Variable`` (``Variable.scatter_add``; towerdist's plain and distributed variables
implement them). ``tests/project/test_api_guarantee.py`` checks towerdist against the file;
the exclusions (TPU-, graph- or gRPC-cluster-only names) live in that test, with reasons.
"""

from __future__ import annotations

import enum
import inspect
import json
import os
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def signature(obj: Any) -> str | None:
    """``obj``'s signature without annotations and without ``self``, e.g. ``"(fn, args=(), kwargs=None)"``.

    ``tests/project/test_api_guarantee.py`` formats towerdist's signatures with this same function.
    """
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    plain = [
        p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values() if p.name != "self"
    ]
    return str(sig.replace(parameters=plain, return_annotation=inspect.Signature.empty))


def describe(obj: Any) -> dict[str, Any]:
    if inspect.ismodule(obj):
        return {"kind": "module"}
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        return {"kind": "enum", "members": {m.name: repr(m.value) for m in obj}}
    if inspect.isclass(obj):
        return {"kind": "class", "signature": signature(obj)}
    return {"kind": "function", "signature": signature(obj)}


def members(cls: type, skip: type | None = None) -> dict[str, Any]:
    out = {}
    for name in sorted(dir(cls)):
        if name.startswith("_") or (skip is not None and hasattr(skip, name)):
            continue
        raw = inspect.getattr_static(cls, name)
        if isinstance(raw, property):
            out[name] = {"kind": "property"}
        else:
            out[name] = {"kind": "method", "signature": signature(getattr(cls, name))}
    return out


def main() -> None:
    import tensorflow as tf

    names: dict[str, Any] = {}
    modules = (
        ("distribute", tf.distribute),
        ("distribute.experimental", tf.distribute.experimental),
        ("distribute.cluster_resolver", tf.distribute.cluster_resolver),
    )
    for prefix, module in modules:
        for name in sorted(dir(module)):
            if not name.startswith("_"):
                names[f"{prefix}.{name}"] = describe(getattr(module, name))
    for label, cls in (
        ("Strategy", tf.distribute.Strategy),
        ("StrategyExtended", tf.distribute.StrategyExtended),
        ("ReplicaContext", tf.distribute.ReplicaContext),
    ):
        for name, info in members(cls).items():
            names[f"{label}.{name}"] = info
    v1_extras = members(tf.compat.v1.distribute.StrategyExtended, skip=tf.distribute.StrategyExtended)
    for name, info in v1_extras.items():
        names[f"StrategyExtended.{name}"] = {**info, "from": "tf.compat.v1.distribute.StrategyExtended"}
    resolvers = tf.distribute.cluster_resolver
    names["train.ClusterSpec"] = describe(tf.train.ClusterSpec)
    names["IndexedSlices"] = describe(tf.IndexedSlices)
    for path, cls in (
        ("distribute.cluster_resolver.ClusterResolver", resolvers.ClusterResolver),
        ("distribute.cluster_resolver.SimpleClusterResolver", resolvers.SimpleClusterResolver),
        ("distribute.cluster_resolver.TFConfigClusterResolver", resolvers.TFConfigClusterResolver),
        ("distribute.cluster_resolver.UnionResolver", resolvers.UnionResolver),
        ("train.ClusterSpec", tf.train.ClusterSpec),
        ("data.Dataset", tf.data.Dataset),
        ("IndexedSlices", tf.IndexedSlices),
        ("Variable", tf.Variable),
    ):
        for name, info in members(cls).items():
            names[f"{path}.{name}"] = info
    json.dump({"tensorflow": tf.__version__, "names": names}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
