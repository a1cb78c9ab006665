"""``tf.distribute.experimental``: CentralStorageStrategy, communication options, value contexts."""

from towerdist._src.options import CommunicationImplementation as CollectiveCommunication
from towerdist._src.options import CommunicationImplementation as CommunicationImplementation
from towerdist._src.options import CommunicationOptions as CommunicationOptions
from towerdist._src.options import ValueContext as ValueContext
from towerdist._src.strategies.central_storage import CentralStorageStrategy as CentralStorageStrategy

__all__ = [
    "CentralStorageStrategy",
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "ValueContext",
]
