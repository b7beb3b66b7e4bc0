import keras
import numpy as np
import pytest

from kerasformer import data
from tests.conftest import to_numpy


def test_number_to_words():
    assert data.number_to_words(0) == "zero"
    assert data.number_to_words(15) == "fifteen"
    assert data.number_to_words(40) == "forty"
    assert data.number_to_words(342) == "three hundred forty two"
    assert data.number_to_words(7001) == "seven thousand one"
    assert data.number_to_words(120500) == "one hundred twenty thousand five hundred"
    with pytest.raises(ValueError, match="n"):
        data.number_to_words(10**6)
    sources, targets = data.numbers_to_words_dataset(5, seed=1)
    for source, target in zip(sources, targets):
        assert data.number_to_words(int(source.replace(" ", ""))) == target


def test_generated_language_agrees_in_number_and_uses_its_words():
    sentences = data.generated_language(200, seed=0)
    words = set(data.LANGUAGE_WORDS)
    plural_nouns, singular_verbs = {"cats", "dogs", "birds", "children", "robots", "farmers"}, {"sees", "likes", "chases", "finds", "helps"}
    for sentence in sentences:
        tokens = sentence.split()
        assert set(tokens) <= words and tokens[-1] == "."
        subject = next(t for t in tokens if t in plural_nouns or t in {"cat", "dog", "bird", "child", "robot", "farmer"})
        verb = tokens[tokens.index(subject) + 1]
        assert (subject in plural_nouns) == (verb not in singular_verbs)


@pytest.mark.parametrize("kind", ["char", "byte", "bpe", "wordpiece", "sentencepiece"])
def test_tokenizers_round_trip_and_save(kind, tmp_path):
    texts = data.generated_language(2000, seed=0)
    tokenizer = data.train_tokenizer(kind, texts, vocabulary_size=50 if kind in ("sentencepiece", "bpe") else 300)
    ids = data.encode(tokenizer, texts[0])
    assert ids.dtype == np.int32 and len(ids) > 0
    decoded = data.decode(tokenizer, ids)
    assert decoded.replace(" ", "") == texts[0].replace(" ", "")
    data.save_tokenizer(tokenizer, tmp_path / kind)
    np.testing.assert_array_equal(data.encode(data.load_tokenizer(tmp_path / kind), texts[0]), ids)
    with pytest.raises(ValueError, match="kind"):
        data.train_tokenizer("unigram-ish", texts)


def test_char_tokenizer_refuses_characters_past_its_vocabulary():
    # KerasHub's tokenizer would clamp them to its last id: "café" as "cafj".
    tokenizer = data.train_tokenizer("char", ["abcdefghij"])
    np.testing.assert_array_equal(data.encode(tokenizer, "jab"), [ord("j"), ord("a"), ord("b")])
    with pytest.raises(ValueError, match=r"`prompt` 'café \{x\}' has characters outside .* below 107.*: 'x', '\{', '\}', 'é'"):
        data.encode(tokenizer, "café {x}", what="`prompt`")
    with pytest.raises(ValueError, match="text 'k' has characters"):
        data.encode(tokenizer, ["abc", "k"])
    assert data.codepoint_limit(data.train_tokenizer("byte", ["abc"])) is None


def test_bpe_vocabulary_is_trained_byte_pair_merges():
    sentencepiece_model = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    texts = ["lower lowest newer newest wider widest"] * 50 + ["low new wide"] * 50
    tokenizer = data.train_tokenizer("bpe", texts, vocabulary_size=40)
    model = sentencepiece_model.ModelProto.FromString(tokenizer.proto)
    assert model.trainer_spec.model_type == sentencepiece_model.TrainerSpec.BPE
    merged = [p.piece for p in model.pieces if p.type == p.NORMAL and len(p.piece) > 1]  # In merge order.
    # Byte-pair encoding: each merged piece joins two parts that exist before
    # it, single characters or earlier merges.
    for rank, piece in enumerate(merged):
        earlier = set(merged[:rank])
        assert any(
            all(len(part) == 1 or part in earlier for part in (piece[:cut], piece[cut:])) for cut in range(1, len(piece))
        ), piece
    assert {"\u2581lowest", "\u2581widest"} <= set(merged)  # The frequent words end up whole.
    ids = data.encode(tokenizer, " lowest widest")  # Each word after a space, as in the texts.
    assert len(ids) == 2 and data.decode(tokenizer, ids) == " lowest widest"


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
def test_subword_tokenizers_give_back_the_exact_text(kind):
    # KerasHub's vocabulary tool normalizes with NFKC: every newline and run of
    # spaces came back as one space, so a GPT trained through it never ended a line.
    sentences = data.generated_language(400, seed=0)
    lines = [("    " if i % 7 == 0 else "") + s + ("\t12" if i % 5 == 0 else "") for i, s in enumerate(sentences)]
    text = "THE CAT:\n" + "\n".join(lines[:200]) + "\n\n  ROBOT:\n" + "\n".join(lines[200:]) + "\n"
    pieces = 4 + 1 + len(set(text) - {"\n"})  # Reserved, newline, characters.
    roomy = data.train_tokenizer(kind, text.splitlines(), vocabulary_size=pieces + 256 + 10)  # Room for 256 bytes.
    small = data.train_tokenizer(kind, text.splitlines(), vocabulary_size=pieces + 15)
    for tokenizer in (roomy, small):
        ids = data.encode(tokenizer, text)
        assert data.decode(tokenizer, ids) == text
        assert 1 not in ids  # No unknown piece.
        newline = tokenizer.token_to_id("\n")
        assert data.encode(tokenizer, "\n").tolist() == [newline] and (ids == newline).sum() == text.count("\n")
    # Characters the texts lack: their UTF-8 bytes where the vocabulary has room, else the unknown piece.
    unseen = "the caf\u00e9 \u2713\n"
    assert data.decode(roomy, data.encode(roomy, unseen)) == unseen
    assert 1 in data.encode(small, unseen)


@pytest.mark.parametrize("kind", ["char", "words", "sentencepiece"])
def test_continuation_keeps_the_prompt_and_spaces_the_new_words(kind):
    texts = ["the cat sat on the mat", "a dog ran to the cat"] * 20
    if kind == "words":
        tokenizer = data.word_tokenizer("the cat sat on mat a dog ran to".split())
    else:
        tokenizer = data.train_tokenizer(kind, texts, vocabulary_size=20)
    prompt = "the cat"
    new = data.encode(tokenizer, "the cat sat on")[len(data.encode(tokenizer, prompt)):]
    # Decoding the new ids alone loses the space before "sat" for word and subword tokenizers.
    assert data.continuation(tokenizer, prompt, data.encode(tokenizer, prompt), new) == "the cat sat on"
    assert data.continuation(tokenizer, prompt, data.encode(tokenizer, prompt), []) == "the cat"


def test_decode_target_ends_at_end_or_padding_and_leaves_out_control_tokens():
    tokenizer = data.word_tokenizer("five four two".split())
    pad, unk, cls, sep, mask, start, end = range(7)  # The special tokens' ids, in order.
    five, four, two = (int(data.encode(tokenizer, w)[0]) for w in ["five", "four", "two"])
    assert data.decode_target(tokenizer, [start, five, cls, four, sep, mask, unk, end, two]) == "five four [UNK]"
    assert data.decode_target(tokenizer, [five, pad, four]) == "five"
    assert data.decode_target(tokenizer, [five, two]) == "five two"
    assert data.decode_target(tokenizer, [end, five]) == ""


def test_byte_pair_tokenizer_from_vocabulary_and_merges(tmp_path):
    vocabulary = {"<pad>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "abc": 5, "Ġ": 6, "Ġab": 7}
    merges = ["a b", "ab c", "Ġ ab"]
    tokenizer = data.byte_pair_tokenizer(vocabulary, merges)
    np.testing.assert_array_equal(data.encode(tokenizer, "abc ab"), [5, 7])
    data.save_tokenizer(tokenizer, tmp_path / "bpe")
    np.testing.assert_array_equal(data.encode(data.load_tokenizer(tmp_path / "bpe"), "abc ab"), [5, 7])


def test_pack_concatenates_documents_into_full_rows():
    rows = data.pack([[1, 2, 3], [4, 5], [6, 7, 8, 9]], length=4, separator_id=0)
    np.testing.assert_array_equal(rows, [[1, 2, 3, 0], [4, 5, 0, 6], [7, 8, 9, 0]])
    assert data.pack([[1, 2]], length=4).shape == (0, 4)


def test_mask_tokens_follows_bert_80_10_10():
    rng = np.random.default_rng(0)
    ids = rng.integers(7, 1000, (400, 128))
    ids[:, -8:] = 0  # Padding is never chosen.
    inputs, labels, weights = data.mask_tokens(ids, mask_token_id=4, vocab_size=1000, special_ids=range(7), seed=0)
    chosen = weights > 0
    np.testing.assert_array_equal(labels, ids)
    assert not chosen[:, -8:].any()
    assert abs(chosen.mean() / (120 / 128) - 0.15) < 0.01
    masked = (inputs == 4) & chosen
    unchanged = (inputs == ids) & chosen
    assert abs(masked.sum() / chosen.sum() - 0.8) < 0.02
    assert abs(unchanged.sum() / chosen.sum() - 0.1) < 0.02  # (plus rare random == original)
    assert np.all(inputs[~chosen] == ids[~chosen])


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="`length` must be a positive int, got 0"):
        data.pack([[1, 2]], length=0)
    with pytest.raises(ValueError, match="`rate` must be in \\(0, 1\\], got 1.5"):
        data.mask_tokens(np.ones((2, 4), "int32"), mask_token_id=3, vocab_size=10, rate=1.5)
    with pytest.raises(ValueError, match="`validation_fraction` must be in \\[0, 1\\), got 1.0"):
        data.split(list(range(10)), validation_fraction=1.0)
    with pytest.raises(ValueError, match="`texts` must be a list of strings, got a single str"):
        data.train_tokenizer("wordpiece", "one text")


@pytest.mark.parametrize("kind", ["bpe", "sentencepiece"])
def test_a_vocabulary_larger_than_the_texts_give_is_named(kind):
    # SentencePiece's trainer raises a RuntimeError from its C++ core.
    with pytest.raises(ValueError, match=f"`vocabulary_size` 500 is more than a {kind} vocabulary these texts can give; at most \\d+"):
        data.train_tokenizer(kind, ["to be or not to be"], vocabulary_size=500)
    with pytest.raises(ValueError, match=f"`texts` hold no characters to train a {kind} vocabulary on"):
        data.train_tokenizer(kind, ["\n\n", ""], vocabulary_size=50)
    # Too small for the reserved pieces: before, SentencePiece's own error came through as a traceback.
    with pytest.raises(ValueError, match=f"SentencePiece cannot train a {kind} vocabulary of `vocabulary_size` 3 on these texts"):
        data.train_tokenizer(kind, ["to be or not to be"], vocabulary_size=3)


def test_a_data_file_that_is_not_utf8_text_is_named(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(b"\x00\x01\xff\xfe binary")
    with pytest.raises(ValueError, match=f"`data` '{path}' must be UTF-8 text: 'utf-8' codec can't decode byte 0xff"):
        data.read_text(str(path))


def test_seq2seq_arrays_shift_targets_for_teacher_forcing():
    inputs, labels, weights = data.seq2seq_arrays([[10, 11, 12], [13]], [[20, 21], [22, 23, 24]], start_id=5, end_id=6)
    np.testing.assert_array_equal(inputs["encoder_token_ids"], [[10, 11, 12], [13, 0, 0]])
    np.testing.assert_array_equal(inputs["decoder_token_ids"], [[5, 20, 21, 0], [5, 22, 23, 24]])
    np.testing.assert_array_equal(labels, [[20, 21, 6, 0], [22, 23, 24, 6]])
    np.testing.assert_array_equal(weights, [[1, 1, 1, 0], [1, 1, 1, 1]])


def test_language_model_batches_are_shifted_windows_and_reproducible():
    stream = np.arange(1000)
    batches = data.LanguageModelBatches(stream, sequence_length=16, batch_size=4, steps=3, seed=0)
    x, y = batches[0]
    assert x.shape == (4, 16)
    np.testing.assert_array_equal(y, x + 1)  # The stream is consecutive numbers.
    np.testing.assert_array_equal(data.LanguageModelBatches(stream, 16, 4, 3, seed=0)[0][0], x)
    batches.on_epoch_end()
    assert not np.array_equal(batches[0][0], x)
    fixed = data.LanguageModelBatches(stream, 16, 4, 3, seed=0, redraw=False)  # A validation sample.
    fixed.on_epoch_end()
    np.testing.assert_array_equal(fixed[0][0], x)
    with pytest.raises(ValueError, match="sequence_length"):
        data.LanguageModelBatches(np.arange(10), 16, 4, 3)


def test_array_batches_cycle_through_every_example():
    inputs = {"ids": np.arange(10)[:, None]}
    batches = data.ArrayBatches(inputs, np.arange(10), np.ones(10), batch_size=5, steps=2, seed=0)
    seen = np.concatenate([batches[i][0]["ids"][:, 0] for i in range(2)])
    assert sorted(seen) == list(range(10))
    x, y, w = batches[1]
    np.testing.assert_array_equal(x["ids"][:, 0], y)
    batches.on_epoch_end()  # Shuffled again for the next pass.
    assert not np.array_equal(np.concatenate([batches[i][1] for i in range(2)]), seen)


def test_array_batches_without_shuffle_read_every_row_once_in_order_every_epoch():
    # As `model.evaluate(x, y)` reads them: a validation set is scored whole,
    # the last batch smaller (the last row had been left out).
    batches = data.ArrayBatches(np.arange(11)[:, None], np.arange(11), batch_size=5, shuffle=False)
    for _ in range(2):
        assert len(batches) == 3
        np.testing.assert_array_equal(np.concatenate([batches[i][1] for i in range(3)]), np.arange(11))
        batches.on_epoch_end()
    cycled = data.ArrayBatches(np.arange(11)[:, None], np.arange(11), batch_size=5, steps=4, shuffle=False)
    np.testing.assert_array_equal(np.concatenate([cycled[i][1] for i in range(4)]), [*range(10), *range(10)])
    # Lists are examples too, as `fit` takes them.
    x, y = data.ArrayBatches([[1, 2], [3, 4]], [5, 6], batch_size=2, shuffle=False)[0]
    np.testing.assert_array_equal(x, [[1, 2], [3, 4]])


def test_seq2seq_arrays_cut_targets_as_keras_hub_start_end_packer_keeping_the_end():
    import keras_hub

    # A cut target still ends in [end], so that the model learns where to stop
    # (the end had been cut off with the target's tail).
    sources, targets = [[10, 11, 12, 13], [14]], [[20, 21, 22, 23, 24], [25]]
    inputs, labels, weights = data.seq2seq_arrays(sources, targets, start_id=5, end_id=6, source_length=3, target_length=4)
    end_packer = keras_hub.layers.StartEndPacker(sequence_length=4, end_value=6, pad_value=0)
    start_packer = keras_hub.layers.StartEndPacker(sequence_length=4, start_value=5, pad_value=0)
    np.testing.assert_array_equal(labels, to_numpy(end_packer(targets)))
    np.testing.assert_array_equal(inputs["decoder_token_ids"], to_numpy(start_packer(targets)))
    np.testing.assert_array_equal(inputs["encoder_token_ids"], [[10, 11, 12], [14, 0, 0]])
    np.testing.assert_array_equal(weights, [[1, 1, 1, 1], [1, 1, 0, 0]])


def test_mask_tokens_draws_random_tokens_from_the_ordinary_vocabulary():
    # Special ids that are not the first ids of the vocabulary, as in Google
    # BERT's ([PAD] 0, [CLS] 101, [SEP] 102, [MASK] 103): a random token is
    # none of them (it had been drawn from every id past len(special_ids)).
    ids = np.full((100, 100), 7)
    inputs, _, weights = data.mask_tokens(ids, mask_token_id=4, vocab_size=10, rate=1.0, special_ids=(0, 2, 3), seed=0)
    random_tokens = inputs[(inputs != 4) & (inputs != 7)]
    assert len(random_tokens) > 500
    assert set(np.unique(random_tokens)) == {1, 5, 6, 8, 9}
    assert weights.all()


def test_language_model_batches_draw_every_window_the_last_one_too():
    # nanoGPT's get_batch draws offsets 0 .. len - T - 1; the last had never been drawn.
    stream = np.arange(10)
    batches = data.LanguageModelBatches(stream, sequence_length=8, batch_size=16, steps=4, seed=0)
    firsts = np.concatenate([batches[i][0][:, 0] for i in range(4)])
    assert set(firsts) == {0, 1}
    x, y = data.LanguageModelBatches(np.arange(9), 8, 2, 1)[0]  # One window only.
    np.testing.assert_array_equal(x, [np.arange(8)] * 2)
    np.testing.assert_array_equal(y, [np.arange(1, 9)] * 2)


def test_language_model_batches_read_an_int32_memmap_in_place(tmp_path):
    # A large corpus stays on disk, as nanoGPT's train.bin: a copy would load it whole.
    stream = np.memmap(tmp_path / "train.bin", dtype="int32", mode="w+", shape=(1000,))
    stream[:] = np.arange(1000)
    batches = data.LanguageModelBatches(stream, 16, 4, 2)
    assert np.shares_memory(batches.stream, stream)
    x, y = batches[0]
    np.testing.assert_array_equal(y, x + 1)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: data.pad_batch([]), "`sequences` is empty"),
        (lambda: data.pad_batch([[1, 2, 3]], length=0), "`length` must be an int >= 1 or None, got 0"),
        (lambda: data.pad_batch([[1.5, 2.7]]), "`sequences\[0\]` must be integer token ids, got dtype float64"),
        (lambda: data.pad_batch(["hello"]), "`sequences\[0\]` must be token ids, got text"),
        (lambda: data.pad_batch([1, 2, 3]), "`sequences\[0\]` must be one sequence \(1-D\) of token ids, got shape \(\)"),
        (lambda: data.pad_batch([[1, -2]]), "`sequences\[0\]` must be token ids >= 0, got -2"),
        (lambda: data.pack([[1.7, 2.2, 3.9, 4.1]], 2), "`documents\[0\]` must be integer token ids"),
        (lambda: data.pack([np.ones((2, 3), "int32")], 2), "`documents\[0\]` must be one sequence \(1-D\) of token ids, got shape \(2, 3\)"),
        (lambda: data.mask_tokens(np.full((2, 4), 50), 3, 10), "`token_ids` must lie in \[0, 10\) \(vocab_size=10\), got values from 50 to 50"),
        (lambda: data.mask_tokens(np.full((2, 4), 5), 12, 10), "`mask_token_id` must be an int in \[0, 10\), got 12"),
        (lambda: data.mask_tokens(np.full((2, 4), 1), 1, 2, special_ids=(0,)), "leave no token of `vocab_size` 2 to draw random tokens from"),
        (lambda: data.seq2seq_arrays([[5], [6]], [[7]], 1, 2), "`sources` and `targets` must pair up one to one, got 2 sources and 1 targets"),
        (lambda: data.seq2seq_arrays([[5]], [[7]], 1, 2, target_length=0), "`target_length` must be an int >= 1 or None, got 0"),
        (lambda: data.seq2seq_arrays([["5"]], [[7]], 1, 2), "`sources\[0\]` must be token ids, got text"),
        (lambda: data.LanguageModelBatches(np.arange(100), 0, 4, 3), "`sequence_length` must be a positive int, got 0"),
        (lambda: data.LanguageModelBatches(np.arange(100), 8, 0, 3), "`batch_size` must be a positive int, got 0"),
        (lambda: data.LanguageModelBatches(np.arange(100), 8, 4, 0), "`steps` must be a positive int, got 0"),
        (lambda: data.LanguageModelBatches(np.arange(100).reshape(10, 10), 4, 4, 3), "`stream` must be one sequence \(1-D\) of token ids, got shape \(10, 10\)"),
        (lambda: data.LanguageModelBatches(np.arange(100) * 1.5, 4, 4, 3), "`stream` must be integer token ids, got dtype float64"),
        (lambda: data.LanguageModelBatches(np.arange(8), 8, 4, 3), "`stream` \(8 tokens\) is shorter than one window of `sequence_length` \+ 1 \(9\)"),
        (lambda: data.ArrayBatches(np.zeros((0, 4)), np.zeros((0, 4))), "`labels` hold no examples"),
        (lambda: data.ArrayBatches(np.zeros((10, 4)), np.zeros((10, 4)), batch_size=0), "`batch_size` must be a positive int, got 0"),
        (lambda: data.ArrayBatches({"a": np.zeros((10, 4))}, np.zeros(8)), r"must hold the same number of examples, got \{'labels': 8, \"inputs\['a'\]\": 10\}"),
        (lambda: data.ArrayBatches(np.zeros((10, 4)), np.zeros(10), np.ones(9)), "got \{'labels': 10, 'weights': 9, 'inputs': 10\}"),
        (lambda: data.decode(data.train_tokenizer("byte", []), np.array([[104, 105]])), "`ids` must be one sequence \(1-D\) of token ids, got shape \(1, 2\)"),
        (lambda: data.number_to_words(3.5), "`n` must be an int in \[0, 1000000\), got 3.5"),
        (lambda: data.numbers_to_words_dataset(3, max_number=10**7), "`max_number` must be an int in \[0, 1000000\), got 10000000"),
        (lambda: data.train_tokenizer("char", []), "`texts` hold no text to train a char vocabulary on: 0 empty string"),
        (lambda: data.train_tokenizer("wordpiece", ["", ""]), "`texts` hold no text to train a wordpiece vocabulary on: 2 empty string"),
    ],
)
def test_bad_data_is_named(call, message):
    # Each had failed inside numpy or TF, or was taken without complaint
    # (float ids cut to other ids, a stream of rows, mismatched counts).
    with pytest.raises(ValueError, match=message):
        call()


def test_pipeline_feeds_fit_on_this_backend():
    from kerasformer.models import from_preset

    batches = data.LanguageModelBatches(np.random.default_rng(0).integers(1, 50, 5000), 16, 8, 4)
    model = from_preset("gpt2-tiny", vocab_size=50)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(batches, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert to_numpy(model(batches[0][0])).shape == (8, 16, 50)
