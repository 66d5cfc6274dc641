"""``import perseus.keras as hvd``: the same module as perseus.tensorflow.keras
(Horovod has both horovod.keras and horovod.tensorflow.keras)."""

import sys

from perseus.tensorflow import keras as _keras

sys.modules[__name__] = _keras
