"""``tf.contrib.distribute`` (TF 1.8-1.14): every name here is a deprecated alias.

``MirroredStrategy`` is ``towerdist.compat.v1.distribute.MirroredStrategy`` (the same
class); ``get_tower_context`` is ``towerdist.compat.v1.get_tower_context``; the cross-tower
ops are the cross-device ops of ``towerdist.distribute``. Each name warns once, naming
its replacement; the table is ``towerdist._src.compat.old_names``.
"""

from towerdist._src import aliases as _aliases
from towerdist._src.compat import old_names as _old_names

__getattr__ = _aliases.module_getattr(__name__, _old_names.CONTRIB_DISTRIBUTE)
__dir__ = _aliases.module_dir(__name__, ())
