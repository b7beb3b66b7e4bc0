"""A user's own layer, in a module of its own: what `export` imports in the TensorFlow process that rebuilds a model."""

import keras


@keras.saving.register_keras_serializable(package="kerasformer_tests")
class Scale(keras.layers.Layer):
    """x * a learned scalar."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(), initializer=keras.initializers.Constant(1.5), name="scale")

    def call(self, x):
        return x * self.scale


@keras.saving.register_keras_serializable(package="kerasformer_tests")
class EagerOnly(keras.layers.Layer):
    """Reads a value back into Python: it runs eagerly but cannot be traced into a graph, so an export fails midway."""

    def call(self, x):
        return x * float(keras.ops.convert_to_numpy(keras.ops.max(x)) > 0)

    def compute_output_shape(self, input_shape):  # Builds the functional graph without tracing `call`.
        return input_shape
