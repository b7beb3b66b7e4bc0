"""Converted models equal randomly initialized Hugging Face references (fp32, 1e-4)."""

import json

import numpy as np
import pytest
import torch
import transformers

from kerasformer.convert import from_huggingface, to_huggingface
from kerasformer.models import BERT, GPT, T5, BERTClassifier, BERTMaskedLM
from tests.conftest import to_numpy

torch.manual_seed(0)
ATOL = 1e-4


def tiny_gpt2(**kwargs):
    config = transformers.GPT2Config(
        vocab_size=97, n_positions=32, n_embd=32, n_layer=2, n_head=4,
        bos_token_id=0, eos_token_id=0, **kwargs,
    )
    return transformers.GPT2LMHeadModel(config).eval()


def tiny_bert_config(**kwargs):
    return transformers.BertConfig(
        vocab_size=101, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=40, **kwargs,
    )


def tiny_t5(**kwargs):
    config = transformers.T5Config(
        vocab_size=103, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=20, **kwargs,
    )
    return transformers.T5ForConditionalGeneration(config).eval()


def token_ids(vocab, shape, seed=0, low=1):
    return np.random.default_rng(seed).integers(low, vocab, shape).astype("int32")


def lm_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()


def test_lm_logits_match():
    hf = tiny_gpt2()
    ids = token_ids(97, (2, 11))
    model = from_huggingface(hf)
    assert isinstance(model, GPT)
    np.testing.assert_allclose(to_numpy(model(ids)), lm_logits(hf, ids), atol=ATOL)


def test_gpt2_with_an_untied_head_matches_and_round_trips(tmp_path):
    # Its lm_head had been left out: the logits came from the token table (0.63 apart).
    hf = tiny_gpt2(tie_word_embeddings=False)
    ids = token_ids(97, (2, 11))
    model = from_huggingface(hf)
    assert not model.tie_embeddings
    np.testing.assert_allclose(to_numpy(model(ids)), lm_logits(hf, ids), atol=ATOL)
    to_huggingface(model, tmp_path / "ours")
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
    np.testing.assert_allclose(lm_logits(reloaded, ids), lm_logits(hf, ids), atol=1e-6)


@pytest.mark.parametrize(
    "make, option",
    [
        (lambda: tiny_gpt2(scale_attn_weights=False), "scale_attn_weights=False"),
        (lambda: tiny_gpt2(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True"),
        (lambda: transformers.BertModel(tiny_bert_config(is_decoder=True)).eval(), "is_decoder=True"),
        (lambda: transformers.BertForMaskedLM(tiny_bert_config(tie_word_embeddings=False)).eval(), "tie_word_embeddings=False"),
    ],
)
def test_options_that_would_compute_another_model_are_refused_by_name(make, option):
    # Each had converted without complaint into a model whose outputs differ
    # from the checkpoint's (by 3e-4 to 0.57 at these tiny random weights).
    with pytest.raises(ValueError, match=f"`{option}` .* not supported"):
        from_huggingface(make())


def test_bert_relative_positions_of_an_older_checkpoint_are_refused(tmp_path):
    # transformers 5 no longer reads `position_embedding_type`; checkpoints of
    # earlier versions trained with relative positions still carry it.
    hf = transformers.BertModel(tiny_bert_config()).eval()
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "position_embedding_type": "relative_key"}))
    with pytest.raises(ValueError, match="`position_embedding_type='relative_key'` .* not supported"):
        from_huggingface(tmp_path)


def tiny_llama(**kwargs):
    config = transformers.LlamaConfig(
        vocab_size=89, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500000.0, **kwargs,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # Norm scales other than 1, so a swapped norm shows.
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize(
    "options",
    [{}, {"num_key_value_heads": 2, "tie_word_embeddings": True}, {"attention_bias": True, "mlp_bias": True}],
    ids=["mha_untied", "gqa_tied", "biases"],
)
def test_llama_logits_match(options):
    hf = tiny_llama(**options)
    ids = token_ids(89, (2, 13))
    model = from_huggingface(hf)
    assert isinstance(model, GPT) and model.position_type == "rotary"
    np.testing.assert_allclose(to_numpy(model(ids)), lm_logits(hf, ids), atol=ATOL)
    # And back: the written state dict is the reference's, weight for weight.
    config, state = to_huggingface(model)
    assert config["model_type"] == "llama" and config["rope_theta"] == 500000.0
    assert model.rotary_max_wavelength == 500000.0
    reference = {k: v for k, v in hf.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    if hf.config.tie_word_embeddings:
        reference.pop("lm_head.weight")
    assert set(state) == set(reference)
    for name, value in state.items():
        np.testing.assert_allclose(value, reference[name].numpy(), atol=1e-7, err_msg=name)


def test_llama_checkpoint_folder_round_trip(tmp_path):
    hf = tiny_llama()
    ids = token_ids(89, (2, 9))
    to_huggingface(from_huggingface(hf), tmp_path / "ours")
    reloaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").eval()
    np.testing.assert_allclose(lm_logits(reloaded, ids), lm_logits(hf, ids), atol=1e-6)


def test_sharded_bfloat16_checkpoint_folder(tmp_path):
    # As most LLaMA-family checkpoints are published: bfloat16 weights in several safetensors shards.
    hf = tiny_llama().to(torch.bfloat16)
    hf.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert len(list((tmp_path / "hf").glob("*.safetensors"))) > 1
    model = from_huggingface(tmp_path / "hf")
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    ids = token_ids(89, (2, 9))
    np.testing.assert_allclose(to_numpy(model(ids)), lm_logits(reference, ids), atol=ATOL)


def test_llama_options_without_counterpart_are_refused():
    with pytest.raises(ValueError, match="rope_scaling"):
        from_huggingface(tiny_llama(rope_scaling={"rope_type": "linear", "factor": 2.0}))
    with pytest.raises(ValueError, match="match no Hugging Face family"):
        to_huggingface(GPT(vocab_size=50, num_layers=1, num_heads=2, hidden_dim=16, position_type="rotary"))


def bert_inputs(vocab, length=9):
    ids = token_ids(vocab, (2, length), low=5)
    ids[1, 6:] = 0  # Padding in the second sequence.
    segments = np.zeros_like(ids)
    segments[:, 4:] = 1
    return ids, segments


def torch_bert_inputs(ids, segments):
    return dict(
        input_ids=torch.tensor(ids, dtype=torch.long),
        token_type_ids=torch.tensor(segments, dtype=torch.long),
        attention_mask=torch.tensor(ids != 0, dtype=torch.long),
    )


def test_bert_backbone_outputs_match():
    hf = transformers.BertModel(tiny_bert_config()).eval()
    ids, segments = bert_inputs(101)
    model = from_huggingface(hf)
    assert isinstance(model, BERT)
    outputs = model({"token_ids": ids, "segment_ids": segments})
    with torch.no_grad():
        expected = hf(**torch_bert_inputs(ids, segments))
    real = ids != 0
    np.testing.assert_allclose(
        to_numpy(outputs["sequence_output"])[real], expected.last_hidden_state.numpy()[real], atol=ATOL
    )
    np.testing.assert_allclose(to_numpy(outputs["pooled_output"]), expected.pooler_output.numpy(), atol=ATOL)


def test_bert_without_segment_ids_matches_transformers_default():
    # transformers takes `token_type_ids` of zeros when they are left out.
    hf = transformers.BertModel(tiny_bert_config()).eval()
    ids, _ = bert_inputs(101)
    model = from_huggingface(hf)
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(ids != 0, dtype=torch.long))
    real = ids != 0
    for inputs in ({"token_ids": ids}, ids):
        outputs = model(inputs)
        np.testing.assert_allclose(
            to_numpy(outputs["sequence_output"])[real], expected.last_hidden_state.numpy()[real], atol=ATOL
        )
        np.testing.assert_allclose(to_numpy(outputs["pooled_output"]), expected.pooler_output.numpy(), atol=ATOL)


@pytest.mark.parametrize("architecture", ["BertForMaskedLM", "BertForSequenceClassification"])
def test_bert_task_models_match(architecture):
    hf = getattr(transformers, architecture)(tiny_bert_config(num_labels=3)).eval()
    ids, segments = bert_inputs(101)
    model = from_huggingface(hf)
    assert isinstance(model, BERTMaskedLM if architecture == "BertForMaskedLM" else BERTClassifier)
    ours = to_numpy(model({"token_ids": ids, "segment_ids": segments}))
    with torch.no_grad():
        expected = hf(**torch_bert_inputs(ids, segments)).logits.numpy()
    if architecture == "BertForMaskedLM":
        ours, expected = ours[ids != 0], expected[ids != 0]
    np.testing.assert_allclose(ours, expected, atol=ATOL)


def t5_logits(hf, encoder_ids, decoder_ids):
    with torch.no_grad():
        return hf(
            input_ids=torch.tensor(encoder_ids, dtype=torch.long),
            attention_mask=torch.tensor(encoder_ids != 0, dtype=torch.long),
            decoder_input_ids=torch.tensor(decoder_ids, dtype=torch.long),
        ).logits.numpy()


@pytest.mark.parametrize(
    "options", [{}, {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}], ids=["v1.0", "v1.1"]
)
def test_t5_logits_match(options):
    hf = tiny_t5(**options)
    encoder_ids = token_ids(103, (2, 12), seed=1, low=2)
    encoder_ids[0, 9:] = 0
    decoder_ids = token_ids(103, (2, 7), seed=2)
    decoder_ids[:, 0] = 0  # The decoder starts from the pad token.
    model = from_huggingface(hf)
    assert isinstance(model, T5)
    ours = model({"encoder_token_ids": encoder_ids, "decoder_token_ids": decoder_ids})
    np.testing.assert_allclose(to_numpy(ours), t5_logits(hf, encoder_ids, decoder_ids), atol=ATOL)


def test_t5_of_default_feed_forward_width_is_written_for_transformers(tmp_path):
    model = T5(vocab_size=103, num_layers=1, num_heads=2, hidden_dim=16, head_dim=8)  # d_ff: 4d
    to_huggingface(model, tmp_path)
    hf = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert hf.config.d_ff == 64
    encoder_ids, decoder_ids = token_ids(103, (2, 9), seed=1, low=2), token_ids(103, (2, 5), seed=2)
    ours = model({"encoder_token_ids": encoder_ids, "decoder_token_ids": decoder_ids})
    np.testing.assert_allclose(to_numpy(ours), t5_logits(hf, encoder_ids, decoder_ids), atol=ATOL)


def test_checkpoint_folder_round_trip(tmp_path):
    """HF writes a folder; we read it, write our own, and HF reads that back."""
    hf = tiny_gpt2()
    hf.save_pretrained(tmp_path / "hf")
    model = from_huggingface(tmp_path / "hf")
    ids = token_ids(97, (2, 8))
    np.testing.assert_allclose(to_numpy(model(ids)), lm_logits(hf, ids), atol=ATOL)

    to_huggingface(model, tmp_path / "ours")
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
    np.testing.assert_allclose(lm_logits(reloaded, ids), lm_logits(hf, ids), atol=1e-6)


@pytest.mark.parametrize("family", ["bert_mlm", "t5"])
def test_written_state_dict_loads_strictly_into_transformers(family):
    hf = transformers.BertForMaskedLM(tiny_bert_config()).eval() if family == "bert_mlm" else tiny_t5()
    config, state = to_huggingface(from_huggingface(hf))
    reference = hf.state_dict()
    for name, value in state.items():
        np.testing.assert_allclose(value, reference[name].numpy(), atol=1e-7, err_msg=name)
    tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "encoder.embed_tokens.weight",
            "decoder.embed_tokens.weight", "lm_head.weight"}
    assert set(reference) - set(state) <= tied


def tiny_bert(**options):
    return BERT(vocab_size=101, num_layers=1, num_heads=4, hidden_dim=32, max_sequence_length=40, **options)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: tiny_bert(norm_first=True), "'norm_first': True.* match no Hugging Face BERT"),
        (lambda: BERTMaskedLM(tiny_bert(norm_type="rms_norm")), "'norm_type': 'rms_norm'.* match no Hugging Face BERT"),
        (lambda: tiny_bert(activation="swiglu"), "'activation': 'swiglu'.* match no Hugging Face BERT"),
        (lambda: tiny_bert(position_type="rotary"), "'position_type': 'rotary'.* match no Hugging Face BERT"),
        (lambda: T5(vocab_size=103, num_layers=1, num_heads=4, hidden_dim=32, activation="geglu"), "`activation='geglu'` .* matches no Hugging Face T5"),
    ],
)
def test_models_without_a_hugging_face_counterpart_are_refused_by_name(make, message):
    # They had been written anyway: a pre-norm BERT as a post-norm one, an
    # RMSNorm one without the LayerNorm biases, SwiGLU as a config transformers
    # cannot read, rotary positions failed with an AttributeError, and an exact
    # GEGLU T5 as "gated-gelu", whose GELU is the tanh one (7e-4 apart).
    with pytest.raises(ValueError, match=message):
        to_huggingface(make())


def test_bad_sources_are_named():
    with pytest.raises(ValueError, match="config.json"):
        from_huggingface("/nonexistent/folder")
    with pytest.raises(ValueError, match="source"):
        from_huggingface(42)


def test_a_quantized_model_is_not_written_as_a_float_checkpoint():
    # Its kernels are int8 with scales apart: written as they are, they would be a checkpoint of wrong weights.
    model = GPT(vocab_size=50, num_layers=1, num_heads=2, hidden_dim=16, max_sequence_length=8)
    to_huggingface(model)
    model.quantize("int8")
    with pytest.raises(ValueError, match="`model` is quantized .*'block_0/"):
        to_huggingface(model)
