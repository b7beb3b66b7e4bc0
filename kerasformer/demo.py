"""The main job, end to end on a generated data set: build, train, evaluate.

    python -m kerasformer.demo

Runs offline in about a minute on 2 CPU cores, on any Keras backend.
"""

import argparse
import time

import keras
import numpy as np

from kerasformer.layers import DecoderBlock, PositionEmbedding


def arithmetic_sequences(count, length, vocab_size, seed=0):
    """Sequences `a, a+d, a+2d, ...` modulo `vocab_size`: a tiny language whose
    next token is predictable once the step d has been seen."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, vocab_size, (count, 1))
    steps = rng.integers(1, 6, (count, 1))
    return ((starts + steps * np.arange(length)) % vocab_size).astype("int32")


def build_model(vocab_size, length, width=64, num_heads=4, num_layers=2):
    tokens = keras.Input((length,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(vocab_size, width)(tokens)
    x = x + PositionEmbedding(sequence_length=length)(x)
    for _ in range(num_layers):
        x = DecoderBlock(num_heads=num_heads, norm_first=True, activation="gelu")(x)
    x = keras.layers.LayerNormalization(epsilon=1e-5)(x)
    logits = keras.layers.Dense(vocab_size, name="lm_head")(x)
    return keras.Model(tokens, logits, name="demo_gpt")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--examples", type=int, default=4096)
    args = parser.parse_args(argv)

    vocab_size, length = 32, 24
    data = arithmetic_sequences(args.examples + 512, length + 1, vocab_size)
    train, test = data[:-512], data[-512:]
    model = build_model(vocab_size, length)
    model.compile(
        optimizer=keras.optimizers.AdamW(2e-3, weight_decay=0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    print(f"backend: {keras.backend.backend()}, parameters: {model.count_params():,}")
    start = time.perf_counter()
    model.fit(train[:, :-1], train[:, 1:], batch_size=64, epochs=args.epochs, verbose=2)
    # Score only positions after the step is visible (the third token on).
    predictions = np.argmax(keras.ops.convert_to_numpy(model.predict(test[:, :-1], verbose=0)), -1)
    accuracy = float(np.mean(predictions[:, 2:] == test[:, 3:]))
    print(f"next-token accuracy on held-out sequences: {accuracy:.3f} ({time.perf_counter() - start:.0f} s)")
    return accuracy


if __name__ == "__main__":
    main()
