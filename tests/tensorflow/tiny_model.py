"""The small two-layer float64 model the TF training tests share: 5 inputs, a tanh
layer of 4, 2 outputs, trained on mean squared error. Its weights are numpy arrays
(or variables made from them) so that references can be computed in plain code."""
import numpy as np
import tensorflow as tf


def init_weights(seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=(5, 4)), rng.normal(size=(4,)), rng.normal(size=(4, 2))]


def forward(ws, x):
    return tf.matmul(tf.tanh(tf.matmul(x, ws[0]) + ws[1]), ws[2])


def mse_gradient(ws, x, y):
    """d mean((forward - y)^2) / d ws at numpy weights ws, in plain eager TensorFlow."""
    ws = [tf.constant(w) for w in ws]
    with tf.GradientTape() as tape:
        tape.watch(ws)
        loss = tf.reduce_mean((forward(ws, tf.constant(x)) - tf.constant(y)) ** 2)
    return [g.numpy() for g in tape.gradient(loss, ws)]


def keras_model(seed):
    """The same model as a Keras Sequential, starting from init_weights(seed)."""
    model = tf.keras.Sequential([tf.keras.Input((5,)),
                                 tf.keras.layers.Dense(4, activation="tanh", dtype="float64"),
                                 tf.keras.layers.Dense(2, use_bias=False, dtype="float64")])
    w = init_weights(seed)
    model.layers[0].set_weights([w[0], w[1]])
    model.layers[1].set_weights([w[2]])
    return model
