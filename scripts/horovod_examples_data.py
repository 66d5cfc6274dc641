"""Small synthetic datasets in the formats Horovod's examples download (MNIST, CIFAR-10,
ImageNet folders and RecordIO), written where each example's loader looks first, so the
examples run unchanged without a network.

The images are learnable: each class is a fixed random template plus per-image noise, so
an example that checks its accuracy (mxnet_mnist asserts > 96 %) can reach it in an epoch.
Needs numpy; the JPEG writers (ImageNet folders, RecordIO) also need Pillow.
"""
import io
import os
import pickle
import struct
import zipfile

import numpy as np

NUM_CLASSES = 10
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def class_images(count, shape, classes=NUM_CLASSES, seed=0):
    """(uint8 images of `shape` per sample, uint8 labels): template of the label + noise.
    The templates depend only on the shape, so training and test sets share them."""
    templates = np.random.default_rng(0).random((classes,) + tuple(shape)) > 0.5
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % classes
    rng.shuffle(labels)
    noise = rng.random((count,) + tuple(shape))
    images = templates[labels] * 180.0 + noise * 75.0
    return images.astype(np.uint8), labels.astype(np.uint8)


def mnist_arrays(train, test, side=28):
    """{file name: array} for MNIST's four idx files: side x side images, 10 classes."""
    x_train, y_train = class_images(train, (side, side), seed=1)
    x_test, y_test = class_images(test, (side, side), seed=2)
    return dict(zip(MNIST_FILES, (x_train, y_train, x_test, y_test)))


def idx_bytes(array):
    """An array as an idx file (MNIST's format): magic 0x08 (uint8) + rank, then the sizes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(">%dI" % array.ndim, *array.shape)
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def write_torchvision_mnist(root, train=1024, test=256):
    """torchvision.datasets.MNIST(root): <root>/MNIST/raw/<idx files> (it checks only that
    they exist, so download=True finds them and downloads nothing)."""
    raw = os.path.join(root, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for name, array in mnist_arrays(train, test).items():
        with open(os.path.join(raw, name), "wb") as f:
            f.write(idx_bytes(array))


def write_keras_mnist(path, train=1024, test=256, side=28):
    """keras.datasets.mnist.load_data's npz (x_train, y_train, x_test, y_test)."""
    arrays = mnist_arrays(train, test, side)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path, x_train=arrays[MNIST_FILES[0]], y_train=arrays[MNIST_FILES[1]],
             x_test=arrays[MNIST_FILES[2]], y_test=arrays[MNIST_FILES[3]])


def write_mxnet_mnist_zip(path, train=4096, test=512):
    """mnist.zip as http://data.mxnet.io/mxnet/data/mnist.zip holds it: the four idx files."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, array in mnist_arrays(train, test).items():
            zf.writestr(name, idx_bytes(array))


def write_cifar10(root, train=32, test=16):
    """torchvision.datasets.CIFAR10(root): <root>/cifar-10-batches-py with five training
    batches, the test batch and batches.meta (pickled dicts, images as rows of 3072 bytes)."""
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder, exist_ok=True)
    x, y = class_images(train, (3, 32, 32), seed=3)
    for i, part in enumerate(np.array_split(np.arange(train), 5), start=1):
        _pickle(os.path.join(folder, "data_batch_%d" % i),
                {"data": x[part].reshape(len(part), -1), "labels": y[part].tolist()})
    x, y = class_images(test, (3, 32, 32), seed=4)
    _pickle(os.path.join(folder, "test_batch"), {"data": x.reshape(test, -1), "labels": y.tolist()})
    _pickle(os.path.join(folder, "batches.meta"),
            {"label_names": ["class%d" % k for k in range(NUM_CLASSES)]})


def _pickle(path, obj):
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def jpeg_bytes(pixels):
    """HxWx3 uint8 -> JPEG bytes (Pillow)."""
    from PIL import Image
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


def write_image_folder(root, classes=2, per_class=4, side=64):
    """An ImageFolder tree: <root>/classK/imgN.jpg."""
    x, y = class_images(classes * per_class, (side, side, 3), classes=classes, seed=5)
    for i, (pixels, label) in enumerate(zip(x, y)):
        folder = os.path.join(root, "class%d" % label)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "img%d.jpg" % i), "wb") as f:
            f.write(jpeg_bytes(pixels))


# MXNet's RecordIO: each record is magic, (flag << 29 | length), the payload padded to 4
# bytes; an image record's payload starts with IRHeader (flag, label, id, id2).
RECORDIO_MAGIC = 0xCED7230A
IRHEADER = struct.Struct("<IfQQ")


def write_mxnet_rec(prefix, count=8, classes=2, side=64):
    """<prefix>.rec and <prefix>.idx of `count` JPEGs, as im2rec writes them."""
    x, y = class_images(count, (side, side, 3), classes=classes, seed=6)
    with open(prefix + ".rec", "wb") as rec, open(prefix + ".idx", "w") as idx:
        for i, (pixels, label) in enumerate(zip(x, y)):
            idx.write("%d\t%d\n" % (i, rec.tell()))
            payload = IRHEADER.pack(0, float(label), i, 0) + jpeg_bytes(pixels)
            rec.write(struct.pack("<II", RECORDIO_MAGIC, len(payload)))
            rec.write(payload + b"\0" * (-len(payload) % 4))
