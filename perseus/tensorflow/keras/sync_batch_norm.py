"""hvd.SyncBatchNormalization of the Keras API: the layer of perseus.tensorflow.sync_batch_norm
(outside this package, so that perseus.tensorflow.horovod exports it too, as Horovod)."""

from perseus.tensorflow.sync_batch_norm import SyncBatchNormalization  # noqa: F401
