"""``tf.distribute.experimental``: communication options and value contexts."""

from towerdist._src.options import CommunicationImplementation as CollectiveCommunication
from towerdist._src.options import CommunicationImplementation as CommunicationImplementation
from towerdist._src.options import CommunicationOptions as CommunicationOptions
from towerdist._src.options import ValueContext as ValueContext

__all__ = [
    "CollectiveCommunication",
    "CommunicationImplementation",
    "CommunicationOptions",
    "ValueContext",
]
