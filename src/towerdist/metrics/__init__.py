"""Streaming metrics with sync-on-read state (``tf.keras.metrics``' API)."""

from towerdist._src.metrics.metric import Mean as Mean
from towerdist._src.metrics.metric import MeanMetricWrapper as MeanMetricWrapper
from towerdist._src.metrics.metric import Metric as Metric
from towerdist._src.metrics.metric import Sum as Sum
from towerdist._src.metrics.wrappers import MeanSquaredError as MeanSquaredError
from towerdist._src.metrics.wrappers import SparseCategoricalAccuracy as SparseCategoricalAccuracy
from towerdist._src.metrics.wrappers import mean_squared_error as mean_squared_error
from towerdist._src.metrics.wrappers import sparse_categorical_accuracy as sparse_categorical_accuracy

__all__ = [
    "Mean",
    "MeanMetricWrapper",
    "MeanSquaredError",
    "Metric",
    "SparseCategoricalAccuracy",
    "Sum",
    "mean_squared_error",
    "sparse_categorical_accuracy",
]
