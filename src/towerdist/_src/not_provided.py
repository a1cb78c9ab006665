"""TensorFlow names that towerdist does not provide, and what a porting user writes instead.

``import towerdist as tf`` runs the ``tf.distribute`` parts of a program; the model code
around them (``tf.keras``, ``tf.GradientTape``, ``tf.matmul``, ``tf.nn.relu``, ...) has no
counterpart here. Looking such a name up raises an ``AttributeError`` (so ``hasattr`` stays
False and ``getattr(tf, name, default)`` works) whose message says what to use instead and
which section of the migration guide explains it. Any other missing public name of
``towerdist`` or ``towerdist.nn`` gets a shorter message pointing at the same guide.

The public modules serve this through :func:`towerdist._src.aliases.module_getattr`,
which looks up the alias table first: an old name that towerdist keeps is never reported
as missing.
"""

from __future__ import annotations

__all__ = ["attribute_error"]

_GUIDE = "docs/migrating-tf2.md"

# Each entry: (the guide's section, what to use instead). The sections are headings of the guide.
_KERAS = (
    "keras-and-checkpoints",
    "towerdist has no Keras. Write the model with numpy (CPU) or cupy (GPU); use td.optimizers, td.metrics, "
    "td.Module and td.train.Checkpoint for the distribution-aware parts of the training loop",
)
_AUTODIFF = (
    "no-automatic-differentiation",
    "towerdist has no automatic differentiation. Compute the gradients yourself in the replica function "
    "(a hand-written backward pass, or an autograd library that works on numpy/cupy arrays) and pass them "
    "to optimizer.apply_gradients()",
)
_ARRAY_OP = (
    "arrays-instead-of-tensors",
    "towerdist's values are numpy (CPU) or cupy (GPU) arrays: call numpy or cupy directly (tf.matmul(x, w) "
    "is x @ w, tf.reshape is np.reshape, ...); towerdist provides only constant, convert_to_tensor, cast, "
    "identity, add_n, reduce_sum, reduce_mean, zeros, ones, range and the dtypes",
)
_NN_OP = (
    "arrays-instead-of-tensors",
    "td.nn provides the loss-scaling helpers compute_average_loss and scale_regularization_loss only. Write "
    "activations and losses with numpy or cupy (tf.nn.relu(x) is np.maximum(x, 0), softmax is "
    "np.exp(x - x.max(-1, keepdims=True)) normalised, ...)",
)
_GRAPH = (
    "tffunction-is-eager",
    "towerdist runs eagerly: there are no graphs, sessions or placeholders (td.function is accepted and "
    "returns the function unchanged)",
)

_ARRAY_NAMES = (
    "abs add argmax argmin argsort boolean_mask broadcast_to clip_by_global_norm clip_by_value concat cos "
    "cumsum divide einsum equal exp expand_dims eye fill floor gather gather_nd greater image less linalg "
    "linspace log lookup math matmul maximum minimum multiply norm not_equal one_hot ones_like pad pow random "
    "rank reduce_all reduce_any reduce_logsumexp reduce_max reduce_min reduce_prod reshape reverse round "
    "scatter_nd shape sigmoid sign sin size slice sort sparse split sqrt square squeeze stack stop_gradient "
    "strings subtract tanh tensor_scatter_nd_update tensordot tile transpose unstack where zeros_like "
    "Tensor TensorShape RaggedTensor SparseTensor"
).split()
_NN_NAMES = (
    "avg_pool avg_pool2d batch_normalization bias_add conv1d conv2d conv2d_transpose dropout elu "
    "embedding_lookup gelu l2_loss l2_normalize leaky_relu log_softmax max_pool max_pool2d moments relu relu6 "
    "selu sigmoid sigmoid_cross_entropy_with_logits silu softmax softmax_cross_entropy_with_logits softplus "
    "sparse_softmax_cross_entropy_with_logits swish tanh"
).split()

_TABLE: dict[str, dict[str, tuple[str, str]]] = {
    "towerdist": {
        "keras": _KERAS,
        "estimator": _KERAS,
        "GradientTape": _AUTODIFF,
        "gradients": _AUTODIFF,
        "custom_gradient": _AUTODIFF,
        "Graph": _GRAPH,
        "Session": _GRAPH,
        "placeholder": _GRAPH,
        "autograph": _GRAPH,
        **{name: _ARRAY_OP for name in _ARRAY_NAMES},
    },
    "towerdist.nn": {name: _NN_OP for name in _NN_NAMES},
}


def attribute_error(module: str, name: str) -> AttributeError:
    """The error for ``module.name`` that does not exist: what to use instead, for TensorFlow names."""
    plain = f"module {module!r} has no attribute {name!r}"
    table = _TABLE.get(module)
    if table is None or name.startswith("_"):  # dunder probes (copy, pickle, inspect) stay quick and plain
        return AttributeError(plain, name=name)
    entry = table.get(name)
    if entry is None:
        tf_name = "tf" + module.removeprefix("towerdist")
        return AttributeError(
            f"{plain}. towerdist provides TensorFlow's distribution API (tf.distribute, tf.data, variables, "
            f"optimizers, metrics, checkpoints), not all of TensorFlow; if {tf_name}.{name} is a TensorFlow "
            f"name, see {_GUIDE}#what-changes for what to use instead.",
            name=name,
        )
    section, instead = entry
    tf_name = "tf" + module.removeprefix("towerdist")
    return AttributeError(f"{plain} ({tf_name}.{name}). {instead}. See {_GUIDE}#{section}.", name=name)
