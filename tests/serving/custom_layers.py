"""A user's own layer, in a module of its own: what `export` imports in the TensorFlow process that rebuilds a model."""

import keras


@keras.saving.register_keras_serializable(package="kerasformer_tests")
class Scale(keras.layers.Layer):
    """x * a learned scalar."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(), initializer=keras.initializers.Constant(1.5), name="scale")

    def call(self, x):
        return x * self.scale
