"""Build a GPT, train it on a generated language, generate text: `python examples/quickstart.py [--steps 300]`."""

import argparse

import keras

from kerasformer import data
from kerasformer.losses import TokenCrossEntropy
from kerasformer.models import from_preset
from kerasformer.optimizers import AdamW  # Keras's AdamW, fused on torch.

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
args = parser.parse_args()
keras.utils.set_random_seed(0)  # The same initial weights, hence the same output, at every run.

text = " ".join(data.generated_language(5000))  # A small English-like language.
tokenizer = data.train_tokenizer("char", [text])  # KerasHub's character tokenizer.
batches = data.LanguageModelBatches(data.encode(tokenizer, text), 64, batch_size=16, steps=args.steps)

model = from_preset("gpt2-tiny", vocab_size=int(tokenizer.vocabulary_size()))
# Clipped: without it, some initializations stall at the loss of letter frequencies (~2.8).
model.compile(optimizer=AdamW(3e-3, global_clipnorm=1.0), loss=TokenCrossEntropy())
model.fit(batches, epochs=1)

prompt = data.encode(tokenizer, "the old cat")
new = model.generate([prompt], max_new_tokens=60, temperature=0.8, top_k=10, seed=0)[0]
print("the old cat" + data.decode(tokenizer, new))
