"""CosmoFlow in TensorFlow/Keras, exactly the reference Sequential model (see model_spec)."""

from __future__ import annotations

from hpckit.cosmoflow.model_spec import N_CHANNELS, N_TARGETS, OUTPUT_SCALE


def build_model(cfg: dict):
    import keras
    from keras import layers

    m, s = cfg["model"], cfg["data"]["sample_size"]
    reg = keras.regularizers.L2(m["l2"]) if m["l2"] > 0 else None
    model = keras.Sequential(name="cosmoflow")
    model.add(keras.Input(shape=(s, s, s, N_CHANNELS)))
    for i in range(m["n_conv_layers"]):
        model.add(layers.Conv3D(m["conv_size"] * 2 ** i, m["kernel_size"], padding="same"))
        model.add(layers.LeakyReLU(negative_slope=m["leaky_relu_alpha"]))
        model.add(layers.MaxPooling3D(pool_size=2))
    model.add(layers.Flatten())
    # L2 on the two hidden dense kernels only, as upstream (mlcommons/hpc 2c627d45
    # cosmoflow/models/cosmoflow.py:76,79; the output Dense at :84 has none)
    for width in (m["fc1_size"], m["fc2_size"]):
        model.add(layers.Dense(width, kernel_regularizer=reg))
        model.add(layers.LeakyReLU(negative_slope=m["leaky_relu_alpha"]))
        model.add(layers.Dropout(m["dropout"]))
    model.add(layers.Dense(N_TARGETS, activation="tanh"))
    model.add(layers.Rescaling(OUTPUT_SCALE))
    return model
