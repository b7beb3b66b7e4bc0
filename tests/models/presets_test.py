"""Full presets have exactly the parameter count of their reference models."""

import numpy as np
import pytest
import torch
import transformers

from kerasformer.convert import from_huggingface
from kerasformer.models import PRESETS, from_preset
from tests.conftest import to_numpy

# The published configurations, in each reference's own terms.
HF_REFERENCES = {
    "gpt2-small": (transformers.GPT2LMHeadModel, transformers.GPT2Config, {}),
    "gpt2-medium": (transformers.GPT2LMHeadModel, transformers.GPT2Config, dict(n_layer=24, n_head=16, n_embd=1024)),
    "bert-base": (transformers.BertModel, transformers.BertConfig, {}),
    "bert-large": (transformers.BertModel, transformers.BertConfig, dict(num_hidden_layers=24, num_attention_heads=16, hidden_size=1024, intermediate_size=4096)),
    "t5-small": (transformers.T5ForConditionalGeneration, transformers.T5Config, {}),
    "t5-base": (transformers.T5ForConditionalGeneration, transformers.T5Config, dict(num_layers=12, num_heads=12, d_model=768, d_ff=3072)),
}
# torch.nn.Transformer has the stacks; the paper's model adds one shared
# embedding (37000 BPE tokens) and, being post-norm, no final norms.
TORCH_TRANSFORMERS = {
    "transformer-base": dict(d_model=512, nhead=8, num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=2048),
    "transformer-big": dict(d_model=1024, nhead=16, num_encoder_layers=6, num_decoder_layers=6, dim_feedforward=4096),
}


def reference_count(name):
    with torch.device("meta"):  # Count without allocating the weights.
        if name in HF_REFERENCES:
            model_class, config_class, kwargs = HF_REFERENCES[name]
            return model_class(config_class(**kwargs)).num_parameters()
        kwargs = TORCH_TRANSFORMERS[name]
        stacks = torch.nn.Transformer(**kwargs)
        final_norms = 2 * 2 * kwargs["d_model"]
        return sum(p.numel() for p in stacks.parameters()) - final_norms + 37000 * kwargs["d_model"]


@pytest.mark.parametrize("name", sorted(set(HF_REFERENCES) | set(TORCH_TRANSFORMERS)))
def test_full_preset_parameter_count_equals_reference(name):
    assert from_preset(name).count_params() == reference_count(name)


def test_every_preset_has_a_tiny_version_that_runs():
    families = {name.rsplit("-", 1)[0] for name in PRESETS}
    assert families == {"gpt2", "bert", "t5", "transformer"}
    for family in families:
        assert f"{family}-tiny" in PRESETS


@pytest.mark.parametrize("name", ["gpt2-tiny", "bert-tiny", "t5-tiny", "transformer-tiny"])
def test_a_misspelt_argument_is_named_not_dropped(name):
    # keras.Model drops keywords it does not know, so `num_layer=1` built the preset's 2 layers.
    builder, arguments = PRESETS[name]
    with pytest.raises(TypeError, match=rf"{builder.__name__} has no argument 'num_layer'; its arguments are vocab_size, num_layers, "):
        builder(**arguments, num_layer=1)
    with pytest.raises(ValueError, match=r"has no argument 'num_layer', 'widht'"):
        from_preset(name, num_layer=1, widht=8)
    model = builder(**arguments, name="renamed")  # What keras.Model takes is still passed on.
    assert model.name == "renamed" and type(model).from_config(model.get_config()).name == "renamed"


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "bert", "t5"])
def test_full_size_conversion_matches_reference(family):
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if family == "gpt2":
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
        ids = rng.integers(0, 50257, (1, 16))
        with torch.no_grad():
            expected = hf(torch.tensor(ids)).logits.numpy()
        ours = to_numpy(from_huggingface(hf)(ids))
    elif family == "bert":
        hf = transformers.BertModel(transformers.BertConfig()).eval()
        ids = rng.integers(1, 30522, (1, 16))
        with torch.no_grad():
            expected = hf(torch.tensor(ids), token_type_ids=torch.zeros_like(torch.tensor(ids))).last_hidden_state.numpy()
        ours = to_numpy(from_huggingface(hf)({"token_ids": ids, "segment_ids": np.zeros_like(ids)})["sequence_output"])
    else:
        hf = transformers.T5ForConditionalGeneration(transformers.T5Config()).eval()
        source, target = rng.integers(2, 32128, (1, 16)), rng.integers(2, 32128, (1, 8))
        with torch.no_grad():
            expected = hf(input_ids=torch.tensor(source), decoder_input_ids=torch.tensor(target)).logits.numpy()
        ours = to_numpy(from_huggingface(hf)({"encoder_token_ids": source, "decoder_token_ids": target}))
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=1e-4)
