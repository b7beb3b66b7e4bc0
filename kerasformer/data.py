"""Data for training: KerasHub tokenizers, generated tasks, and batch pipelines.

Everything here runs in numpy once the text is tokenized, so one pipeline
(`keras.utils.PyDataset`) feeds `model.fit` on TensorFlow, JAX and PyTorch
alike. Tokenizers come from KerasHub; nothing is downloaded.
"""

import math
import os
import re

import keras
import numpy as np

from kerasformer.checks import check_int, check_positive_int
from kerasformer.layers.embedding import check_token_ids

PAD, UNK, CLS, SEP, MASK, START, END = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[START]", "[END]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK, START, END]  # Ids 0..6 in every word vocabulary.
TOKENIZER_KINDS = ("char", "byte", "bpe", "wordpiece", "sentencepiece")


# Tokenizers (KerasHub) ------------------------------------------------------


def train_tokenizer(kind, texts, vocabulary_size=None):
    """A KerasHub tokenizer of `kind`, with its vocabulary learned from `texts`.

    Args:
        kind: "char" (Unicode code points, vocabulary = largest code point
            seen + 1), "byte" (256 bytes), "bpe" (byte-pair merges),
            "wordpiece" or "sentencepiece" (unigram). WordPiece vocabularies
            are trained by KerasHub's tool; "bpe" and "sentencepiece" by
            SentencePiece's trainer (as KerasHub's tool, but without its
            normalization), so that they decode to the exact text, newlines
            and spaces included, as GPT-2's and LLaMA's tokenizers do.
        texts: a list of strings.
        vocabulary_size: for "bpe", "wordpiece" and "sentencepiece".
    """
    import keras_hub
    import tensorflow as tf  # KerasHub's vocabulary tools read tf.data (a list means file names).

    if isinstance(texts, (str, bytes)):  # Would be read a character at a time.
        raise ValueError(f"`texts` must be a list of strings, got a single {type(texts).__name__}; pass [text].")
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"Unknown tokenizer `kind` {kind!r}; expected one of {TOKENIZER_KINDS}.")
    texts = list(texts)
    if kind != "byte" and not any(texts):  # The byte vocabulary is fixed.
        raise ValueError(f"`texts` hold no text to train a {kind} vocabulary on: {len(texts)} empty string(s).")
    if kind == "char":
        largest = max(max(map(ord, text), default=0) for text in texts)
        return keras_hub.tokenizers.UnicodeCodepointTokenizer(
            vocabulary_size=largest + 1, lowercase=False, normalization_form=None, dtype="int32"
        )
    if kind == "byte":
        return keras_hub.tokenizers.ByteTokenizer(dtype="int32")
    if kind == "wordpiece":
        vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
            tf.data.Dataset.from_tensor_slices(list(texts)), vocabulary_size=vocabulary_size or 8000, reserved_tokens=SPECIAL_TOKENS, lowercase=False
        )
        return keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary, lowercase=False, dtype="int32")
    if kind in ("sentencepiece", "bpe"):
        return keras_hub.tokenizers.SentencePieceTokenizer(
            proto=_sentence_piece_proto(kind, texts, vocabulary_size or 8000), dtype="int32"
        )


# SentencePiece trained to give back the exact text, as LLaMA's tokenizer does.
# KerasHub's `compute_sentence_piece_proto` applies NFKC normalization, which
# turns every newline and run of spaces into one space: a GPT trained on
# Shakespeare through it could never end a line.
_LOSSLESS_SENTENCE_PIECE = dict(
    normalization_rule_name="identity",
    remove_extra_whitespaces=False,
    allow_whitespace_only_pieces=True,  # Runs of spaces (indentation) may be pieces.
    add_dummy_prefix=False,  # A text's tokens are then those of its parts, as in GPT-2.
    user_defined_symbols=["\n"],  # A piece of its own; the trainer reads lines.
    character_coverage=1.0,  # Every character of the texts is a piece.
    split_digits=True,
    pad_id=0, unk_id=1, bos_id=2, eos_id=3,  # KerasHub's reserved ids.
)
_LONGEST_SENTENCE = 4096  # Characters; the trainer skips longer sentences, so lines are cut.
_BYTE_PIECES = 256


def _sentence_piece_proto(kind, texts, vocabulary_size):
    """A trained SentencePiece model ("bpe" or unigram "sentencepiece") that decodes to the exact text.

    With room in `vocabulary_size` for the 256 UTF-8 byte pieces beyond the
    texts' characters, a character the texts lack is encoded as its bytes
    (`byte_fallback`, as LLaMA) rather than as the unknown piece.
    """
    import io

    import sentencepiece

    characters = set().union(*map(set, texts)) - {"\n"}
    reserved = 4 + len(_LOSSLESS_SENTENCE_PIECE["user_defined_symbols"])
    sentences = [
        line[start : start + _LONGEST_SENTENCE]
        for text in texts
        for line in text.splitlines()
        for start in range(0, len(line), _LONGEST_SENTENCE)
    ]
    if not sentences:
        raise ValueError(f"`texts` hold no characters to train a {kind} vocabulary on, only line breaks.")
    model = io.BytesIO()
    # The trainer logs its whole spec and every iteration (~90 lines) at INFO.
    sentencepiece.set_min_log_level(1)
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            vocab_size=vocabulary_size,
            model_type="bpe" if kind == "bpe" else "unigram",
            byte_fallback=vocabulary_size >= reserved + len(characters) + _BYTE_PIECES,
            max_sentence_length=4 * _LONGEST_SENTENCE,  # In bytes.
            **_LOSSLESS_SENTENCE_PIECE,
        )
    except RuntimeError as error:  # The trainer's own words: "... Please set it to a value <= 1479."
        most = re.search(r"value <= (\d+)", str(error))
        if most is None:  # Too small: e.g. "Vocabulary size is smaller than required_chars".
            raise ValueError(
                f"SentencePiece cannot train a {kind} vocabulary of `vocabulary_size` {vocabulary_size} on "
                f"these texts: it needs room for its {reserved} reserved pieces and the texts' "
                f"{len(characters)} characters ({error})."
            ) from None
        raise ValueError(
            f"`vocabulary_size` {vocabulary_size} is more than a {kind} vocabulary these texts can give; "
            f"at most {most.group(1)}."
        ) from None
    finally:
        sentencepiece.set_min_log_level(0)  # SentencePiece's default.
    return model.getvalue()


def byte_pair_tokenizer(vocabulary, merges):
    """KerasHub's byte-pair (GPT-2 style) tokenizer from a vocabulary and merge rules.

    Args:
        vocabulary: `{token: id}` or the path of a `vocab.json`.
        merges: a list of "a b" merge rules, or the path of a `merges.txt`.

    KerasHub trains no vocabulary for this GPT-2 style tokenizer; bring one
    (e.g. GPT-2's files on disk), or train byte-pair merges on your text with
    `train_tokenizer("bpe", texts)`.
    """
    import keras_hub

    return keras_hub.tokenizers.BytePairTokenizer(vocabulary=vocabulary, merges=merges, dtype="int32")


def word_tokenizer(words):
    """A KerasHub WordPiece tokenizer over a known word list (special tokens first)."""
    import keras_hub

    vocabulary = SPECIAL_TOKENS + [w for w in dict.fromkeys(words) if w not in SPECIAL_TOKENS]
    return keras_hub.tokenizers.WordPieceTokenizer(vocabulary=vocabulary, lowercase=False, dtype="int32")


def codepoint_limit(tokenizer):
    """The first code point a "char" tokenizer cannot represent; None for other tokenizers.

    KerasHub's `UnicodeCodepointTokenizer` clamps larger code points to its
    last id, so an unseen character would silently read as another one
    ("café" as "cafz" after training on ASCII text).
    """
    import keras_hub

    if isinstance(tokenizer, keras_hub.tokenizers.UnicodeCodepointTokenizer):
        return tokenizer.vocabulary_size()
    return None


def encode(tokenizer, texts, what="text"):
    """Token ids of each text, as a list of int32 numpy arrays.

    A character a "char" tokenizer cannot represent (see `codepoint_limit`)
    is refused with a ValueError naming `what` and the characters.
    """
    single = isinstance(texts, str)
    texts = [texts] if single else list(texts)  # Read twice: checked, then tokenized.
    limit = codepoint_limit(tokenizer)
    for text in texts if limit is not None else []:
        if text and ord(max(text)) >= limit:
            unknown = sorted({c for c in text if ord(c) >= limit})
            raise ValueError(
                f"{what} {text!r} has characters outside the char tokenizer's vocabulary (code points below {limit}, "
                f"from its training text): {', '.join(repr(c) for c in unknown)}."
            )
    ids = tokenizer(texts[0] if single else texts)
    if single:
        return np.asarray(keras.ops.convert_to_numpy(ids), "int32")
    if hasattr(ids, "to_list"):  # A tf.RaggedTensor.
        return [np.asarray(row, "int32") for row in ids.to_list()]
    return [np.asarray(row, "int32") for row in ids]


def decode(tokenizer, ids, until_padding=True):
    """Text of token ids, cut at the first padding id (unless `until_padding=False`)."""
    ids = [int(i) for i in token_id_array("ids", ids)]
    if until_padding and 0 in ids:
        ids = ids[: ids.index(0)]
    text = tokenizer.detokenize(np.asarray(ids, "int32"))
    text = keras.ops.convert_to_numpy(text) if not isinstance(text, (str, bytes)) else text
    if hasattr(text, "item"):
        text = text.item()
    return text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)


# Ids a seq2seq target's text leaves out: they steer the model, they are not
# words (as KerasHub's Seq2SeqLM and `transformers`' skip_special_tokens);
# [UNK] stays, as it stands for words of the text.
CONTROL_TOKENS = [PAD, CLS, SEP, MASK, START, END]


def decode_target(tokenizer, ids):
    """Text of a generated seq2seq target: up to its first [END] or padding, without control tokens."""
    ids = [int(i) for i in ids]
    end, pad = SPECIAL_TOKENS.index(END), SPECIAL_TOKENS.index(PAD)
    ids = ids[: next((i for i, t in enumerate(ids) if t in (end, pad)), len(ids))]
    control = {SPECIAL_TOKENS.index(t) for t in CONTROL_TOKENS}
    return decode(tokenizer, [t for t in ids if t not in control])


def continuation(tokenizer, prompt, prompt_ids, new_ids):
    """`prompt` followed by the text of `new_ids`, spaced as the tokenizer joins them.

    Subword and word tokenizers put the space between two words into the
    second token ("\u2581sat") or the join, which decoding the new ids alone
    drops; so the text is decoded with the prompt's ids and the prompt's own
    decoding cut off (as `transformers`' text-generation pipeline does), and
    the prompt is kept as written.
    """
    prompt_ids = [int(i) for i in prompt_ids]
    whole = decode(tokenizer, prompt_ids + [int(i) for i in new_ids])
    return prompt + whole[len(decode(tokenizer, prompt_ids)):]


def save_tokenizer(tokenizer, folder):
    """Writes the tokenizer (config and vocabulary assets) into `folder`."""
    import json

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(keras.saving.serialize_keras_object(tokenizer), f, indent=2)
    if hasattr(tokenizer, "save_assets"):  # Vocabulary files (WordPiece, SentencePiece).
        assets = os.path.join(folder, "assets", "tokenizer")
        os.makedirs(assets, exist_ok=True)
        tokenizer.save_assets(assets)


def load_tokenizer(folder):
    """The tokenizer `save_tokenizer` wrote into `folder`."""
    import json

    import keras_hub  # noqa: F401 - registers the tokenizer classes.

    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise ValueError(f"{folder!r} holds no tokenizer (no tokenizer.json).")
    with open(path) as f:
        tokenizer = keras.saving.deserialize_keras_object(json.load(f))
    assets = os.path.join(folder, "assets", "tokenizer")
    if os.path.isdir(assets):
        tokenizer.load_assets(assets)
    return tokenizer


def read_text(path):
    if not os.path.isfile(path):
        raise ValueError(f"`data` {path!r} is not a file.")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as error:
        raise ValueError(f"`data` {path!r} must be UTF-8 text: {error}.") from None


# Generated tasks (offline, with a measurable score) ------------------------

_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_to_words(n):
    """English words of 0 <= n < 1,000,000: 342 -> "three hundred forty two"."""
    check_int("n", n, 0, 1_000_000)
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + number_to_words(rest))
    rest = n % 1000
    return number_to_words(n // 1000) + " thousand" + ("" if rest == 0 else " " + number_to_words(rest))


NUMBER_WORDS = list("0123456789") + _ONES + [t for t in _TENS if t != "_"] + ["hundred", "thousand"]


def numbers_to_words_dataset(count, max_number=9999, seed=0):
    """`(sources, targets)`: digit strings ("3 4 2", space-separated) and their words."""
    check_int("count", count)
    check_int("max_number", max_number, 0, 1_000_000)
    rng = np.random.default_rng(seed)
    numbers = rng.integers(0, max_number + 1, count)
    return [" ".join(str(n)) for n in numbers], [number_to_words(int(n)) for n in numbers]


# A tiny English-like language: subject-verb agreement, adjectives, objects.
_GRAMMAR = {
    "det": ["the", "a", "every", "some"],
    "adj": ["small", "big", "red", "old", "quick", "quiet"],
    "noun": ["cat", "dog", "bird", "child", "robot", "farmer"],
    "nouns": ["cats", "dogs", "birds", "children", "robots", "farmers"],
    "verb": ["sees", "likes", "chases", "finds", "helps"],
    "verbs": ["see", "like", "chase", "find", "help"],
    "place": ["in the garden", "near the river", "at home", "on the hill"],
}
LANGUAGE_WORDS = sorted({w for words in _GRAMMAR.values() for p in words for w in p.split()} | {"."})


def generated_language(count, seed=0):
    """`count` sentences of a small grammar ("the old cat sees some birds near the river .")."""
    rng = np.random.default_rng(seed)
    pick = lambda key: _GRAMMAR[key][rng.integers(len(_GRAMMAR[key]))]  # noqa: E731
    sentences = []
    for _ in range(count):
        plural = rng.random() < 0.5
        subject = ("the" if plural else pick("det")) + " "
        if rng.random() < 0.5:
            subject += pick("adj") + " "
        subject += pick("nouns" if plural else "noun")
        verb = pick("verbs" if plural else "verb")
        obj = pick("det") + " " + pick("noun")
        tail = " " + pick("place") if rng.random() < 0.4 else ""
        sentences.append(f"{subject} {verb} {obj}{tail} .")
    return sentences


# Batching -------------------------------------------------------------------


def token_id_array(name, ids, ndim=1):
    """`ids` as an int32 numpy array, or a ValueError naming `name`.

    Token ids are integers >= 0 in an array of `ndim` dimensions (None: any
    but 0). Floats would be cut to other ids and text is not yet tokenized,
    so both are refused, as are rows of different lengths.
    """
    try:
        array = keras.ops.convert_to_numpy(ids) if keras.ops.is_tensor(ids) else np.asarray(ids)  # A tensor may be on a GPU.
    except ValueError:  # numpy refuses ragged rows.
        raise ValueError(f"`{name}` must be an array of token ids; its rows differ in length.") from None
    if array.size == 0 and array.dtype.kind == "f":  # `[]` reads as float64.
        array = array.astype("int32")
    if array.dtype.kind in "USO":
        raise ValueError(f"`{name}` must be token ids, got text or objects ({array.dtype}); encode text first, e.g. with `data.encode`.")
    if array.dtype.kind not in "iu":
        raise ValueError(f"`{name}` must be integer token ids, got dtype {array.dtype}.")
    if array.ndim != ndim if ndim is not None else array.ndim == 0:
        expected = "one sequence (1-D)" if ndim == 1 else f"a {ndim}-D array" if ndim else "an array"
        raise ValueError(f"`{name}` must be {expected} of token ids, got shape {array.shape}.")
    if array.size and array.min() < 0:
        raise ValueError(f"`{name}` must be token ids >= 0, got {array.min()}.")
    return array.astype("int32", copy=False)  # An int32 memmap of a large corpus stays on disk.


def pack(documents, length, separator_id=None):
    """Packs token id documents into `(N, length)` rows with no padding.

    Documents are concatenated (with `separator_id` between them, if given)
    and cut into rows; the remainder shorter than a row is dropped.
    """
    check_positive_int("length", length)
    check_int("separator_id", separator_id, none_ok=True)
    pieces = []
    for i, document in enumerate(documents):
        pieces.append(token_id_array(f"documents[{i}]", document))
        if separator_id is not None:
            pieces.append(np.array([separator_id], "int32"))
    stream = np.concatenate(pieces) if pieces else np.zeros((0,), "int32")
    rows = len(stream) // length
    return stream[: rows * length].reshape(rows, length)


def pad_batch(sequences, length=None, pad_id=0):
    """Right-pads token id sequences into an `(N, length)` int32 array.

    Args:
        sequences: token id sequences of any lengths.
        length: the rows' length; longer sequences are cut to it. None: the
            longest sequence's length.
        pad_id: the id after each sequence (0, which the models mask).
    """
    return _pad_rows("sequences", sequences, length, pad_id)


def _pad_rows(name, sequences, length=None, pad_id=0, length_name="length"):
    """`pad_batch`, naming the sequences `name` and their length `length_name` in its errors."""
    check_int(length_name, length, low=1, none_ok=True)
    check_int("pad_id", pad_id)
    sequences = [token_id_array(f"{name}[{i}]", sequence) for i, sequence in enumerate(sequences)]
    if not sequences and length is None:
        raise ValueError(f"`{name}` is empty: there is no sequence to pad (give one at least, or a `length`).")
    length = length or max(len(s) for s in sequences)
    batch = np.full((len(sequences), length), pad_id, "int32")
    for row, sequence in enumerate(sequences):
        sequence = sequence[:length]
        batch[row, : len(sequence)] = sequence
    return batch


def mask_tokens(token_ids, mask_token_id, vocab_size, rate=0.15, special_ids=(0,), seed=None):
    """BERT's masking: `rate` of the real tokens are chosen; of those 80% become
    `[MASK]`, 10% a random token and 10% stay.

    Args:
        token_ids: an integer array of token ids, below `vocab_size`.
        mask_token_id: the id of `[MASK]`.
        vocab_size: the model's vocabulary size.
        rate: the fraction of real tokens chosen.
        special_ids: ids that are never chosen (padding, `[CLS]`, `[SEP]`)
            and, with `mask_token_id`, never drawn as a random token.
        seed: seed of the draws.

    Returns:
        `(inputs, labels, weights)`: masked ids, the original ids, and 1.0 at
        the chosen positions (use as `sample_weight`).
    """
    if not 0 < rate <= 1:
        raise ValueError(f"`rate` must be in (0, 1], got {rate!r}.")
    check_positive_int("vocab_size", vocab_size)
    check_int("mask_token_id", mask_token_id, 0, vocab_size)
    token_ids = token_id_array("token_ids", token_ids, ndim=None)
    check_token_ids(token_ids, vocab_size)
    special_ids = list(special_ids)
    for i, special in enumerate(special_ids):
        check_int(f"special_ids[{i}]", special, 0, vocab_size)
    # Random tokens are words of the vocabulary, as a real sentence could hold.
    ordinary = np.setdiff1d(np.arange(vocab_size), special_ids + [mask_token_id]).astype("int32")
    if not len(ordinary):
        raise ValueError(f"`special_ids` and `mask_token_id` leave no token of `vocab_size` {vocab_size} to draw random tokens from.")
    rng = np.random.default_rng(seed)
    candidates = ~np.isin(token_ids, np.asarray(special_ids, "int32"))
    chosen = candidates & (rng.random(token_ids.shape) < rate)
    action = rng.random(token_ids.shape)
    inputs = token_ids.copy()
    inputs[chosen & (action < 0.8)] = mask_token_id
    random_positions = chosen & (action >= 0.8) & (action < 0.9)
    inputs[random_positions] = ordinary[rng.integers(0, len(ordinary), random_positions.sum())]
    return inputs, token_ids.copy(), chosen.astype("float32")  # Labels apart from the caller's array.


def seq2seq_arrays(sources, targets, start_id, end_id, source_length=None, target_length=None):
    """Teacher forcing: `({"encoder_token_ids", "decoder_token_ids"}, labels, weights)`.

    The decoder reads `[start] + target` and predicts `target + [end]`;
    weights are 1 on real label positions. A target longer than
    `target_length` is cut to leave room for `[end]` (as KerasHub's
    `StartEndPacker`), so that the model still learns where to stop; a
    source is cut to `source_length`.
    """
    if len(sources) != len(targets):
        raise ValueError(f"`sources` and `targets` must pair up one to one, got {len(sources)} sources and {len(targets)} targets.")
    check_int("start_id", start_id)
    check_int("end_id", end_id)
    check_int("target_length", target_length, low=1, none_ok=True)
    targets = [token_id_array(f"targets[{i}]", t)[: None if target_length is None else target_length - 1] for i, t in enumerate(targets)]
    encoder = _pad_rows("sources", sources, source_length, length_name="source_length")
    labels = _pad_rows("targets", [np.append(t, end_id) for t in targets], target_length, length_name="target_length")
    decoder = _pad_rows("targets", [np.insert(t, 0, start_id) for t in targets], labels.shape[1])
    weights = (labels != 0).astype("float32")
    return {"encoder_token_ids": encoder, "decoder_token_ids": decoder}, labels, weights


def default_workers():
    """Threads that prepare batches ahead of the training step: 2 on TF, else 1.

    On TensorFlow, Keras feeds a single-worker `PyDataset` through tf.data
    with an autotuned prefetch; on a 2-core machine that autotuner stalled
    about half of all training processes by ~0.3 s per step (1.45x slower,
    GPT of `benchmarks/train_throughput.py`). With 2 workers Keras prefetches
    in threads and turns the autotuner off. JAX and torch read the batches
    directly.
    """
    return 2 if keras.backend.backend() == "tensorflow" else 1


class _Batches(keras.utils.PyDataset):
    def __init__(self, **kwargs):
        kwargs.setdefault("workers", default_workers())
        super().__init__(**kwargs)


class LanguageModelBatches(_Batches):
    """Random windows of a token stream (nanoGPT's `get_batch`), for `fit`.

    Each item is `(x, y)` with `x = stream[i : i + T]`, `y = stream[i+1 : i+T+1]`
    for `batch_size` random offsets; the draw is seeded per epoch and index,
    so a resumed run sees the same batches.

    Args:
        stream: 1-D token ids.
        sequence_length: T.
        batch_size: rows per batch.
        steps: batches per epoch.
        seed: seed of the offsets.
        redraw: False draws the same windows every epoch: a fixed validation
            sample, which gives the same score to the same weights.
        **kwargs: `keras.utils.PyDataset` arguments; `workers` defaults to
            `default_workers()`.
    """

    def __init__(self, stream, sequence_length, batch_size, steps, seed=0, redraw=True, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("sequence_length", sequence_length)
        check_positive_int("batch_size", batch_size)
        check_positive_int("steps", steps)
        self.stream = token_id_array("stream", stream)
        if len(self.stream) < sequence_length + 1:
            raise ValueError(
                f"The token `stream` ({len(self.stream)} tokens) is shorter than one window of "
                f"`sequence_length` + 1 ({sequence_length + 1}) tokens."
            )
        self.sequence_length = sequence_length
        self.batch_size = batch_size
        self.steps = steps
        self.seed = seed
        self.redraw = redraw
        self.epoch = 0

    def __len__(self):
        return self.steps

    def on_epoch_end(self):
        if self.redraw:
            self.epoch += 1

    def __getitem__(self, index):
        rng = np.random.default_rng((self.seed, self.epoch, index))
        # Any window of T + 1 tokens, the last one too: offsets 0 .. len - T - 1.
        offsets = rng.integers(0, len(self.stream) - self.sequence_length, self.batch_size)
        window = offsets[:, None] + np.arange(self.sequence_length + 1)[None, :]
        tokens = self.stream[window]  # (B, T + 1)
        return tokens[:, :-1], tokens[:, 1:]


class ArrayBatches(_Batches):
    """Shuffled batches of in-memory examples, `steps` per epoch, for `fit`.

    Args:
        inputs: an array, or a dict of arrays, with examples on axis 0.
        labels: `(N, ...)` targets.
        weights: optional `(N, ...)` sample weights.
        batch_size: rows per batch.
        steps: batches per epoch (the data is cycled through, reshuffled
            after each full pass).
        transform: optional `f(inputs, labels, weights, seed) -> (inputs, labels, weights)`
            applied to each batch (e.g. fresh MLM masking).
        seed: seed of the shuffles and of `transform`.
        shuffle: False reads the rows in order, in the same batches every
            epoch: a validation set then gives the same score to the same
            weights. Without `steps`, an epoch is then every row once, the
            last batch smaller if need be (as `model.evaluate(x, y)` reads
            them).
        **kwargs: `keras.utils.PyDataset` arguments; `workers` defaults to
            `default_workers()`.
    """

    def __init__(self, inputs, labels, weights=None, batch_size=32, steps=None, transform=None, seed=0, shuffle=True, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("batch_size", batch_size)
        check_int("steps", steps, low=1, none_ok=True)
        inputs = {k: np.asarray(v) for k, v in inputs.items()} if isinstance(inputs, dict) else np.asarray(inputs)
        labels, weights = np.asarray(labels), None if weights is None else np.asarray(weights)
        counts = {"labels": len(labels), "weights": None if weights is None else len(weights)}
        counts.update({f"inputs[{k!r}]": len(v) for k, v in inputs.items()} if isinstance(inputs, dict) else {"inputs": len(inputs)})
        counts = {name: count for name, count in counts.items() if count is not None}
        if len(set(counts.values())) > 1:
            raise ValueError(f"`inputs`, `labels` and `weights` must hold the same number of examples, got {counts}.")
        if not len(labels):
            raise ValueError("`labels` hold no examples: there is nothing to batch.")
        self.inputs, self.labels, self.weights = inputs, labels, weights
        self.count = len(labels)
        self.batch_size = min(batch_size, self.count)
        self.batches_per_pass = self.count // self.batch_size
        self.every_row_in_order = not shuffle and steps is None
        self.steps = steps or (math.ceil(self.count / self.batch_size) if self.every_row_in_order else self.batches_per_pass)
        self.transform, self.seed, self.shuffle, self.epoch = transform, seed, shuffle, 0

    def __len__(self):
        return self.steps

    def on_epoch_end(self):
        self.epoch += 1

    def __getitem__(self, index):
        position = self.epoch * self.steps + index
        start = (position % self.batches_per_pass) * self.batch_size
        rows = np.arange(start, start + self.batch_size)
        if self.every_row_in_order:
            rows = np.arange(index * self.batch_size, min((index + 1) * self.batch_size, self.count))
        if self.shuffle:
            rows = np.random.default_rng((self.seed, position // self.batches_per_pass)).permutation(self.count)[rows]
        take = lambda a: None if a is None else a[rows]  # noqa: E731
        inputs = {k: v[rows] for k, v in self.inputs.items()} if isinstance(self.inputs, dict) else self.inputs[rows]
        batch = (inputs, take(self.labels), take(self.weights))
        if self.transform is not None:
            batch = self.transform(*batch, seed=(self.seed, position))
        return batch if batch[2] is not None else batch[:2]


def split(items, validation_fraction=0.1):
    """First `1 - fraction` for training, the rest for validation (nanoGPT's 90/10)."""
    if not 0 <= validation_fraction < 1:
        raise ValueError(f"`validation_fraction` must be in [0, 1), got {validation_fraction!r}: training needs items.")
    cut = int(math.floor(len(items) * (1 - validation_fraction)))
    return items[:cut], items[cut:]
