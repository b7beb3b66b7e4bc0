"""Weights from and to Hugging Face `transformers` checkpoints: GPT-2, LLaMA, BERT, T5.

    model = kerasformer.convert.from_huggingface("path/to/checkpoint")  # or a HF model object
    kerasformer.convert.to_huggingface(model, "path/to/new_checkpoint")

A checkpoint folder holds `config.json` and `*.safetensors` (what
`save_pretrained` writes). Nothing is downloaded. Each family is a table of
`(hf_name, variable, layout)` rows, read one way to load and the other to save.
"""

import json
import os

import numpy as np
from keras.ops import convert_to_numpy as keras_to_numpy

# Layouts of a row: how a Keras variable is laid out as a Hugging Face tensor.
# Loading transposes the "linear" ones and reshapes to the variable's shape.
LAYOUTS = {
    "copy": lambda v: v,  # Embeddings, norms, 1-D biases, 2-D Conv1D kernels.
    "flat": lambda v: v.reshape(-1),  # Per-head biases (H, D) -> (H*D,).
    "in_major": lambda v: v.reshape(v.shape[0], -1),  # Conv1D kernel (C, H, D) -> (C, H*D).
    "heads_in_major": lambda v: v.reshape(-1, v.shape[-1]),  # Conv1D (H, D, C) -> (H*D, C).
    "linear": lambda v: v.reshape(v.shape[0], -1).T,  # torch Linear (out, in).
    "linear_from_heads": lambda v: v.reshape(-1, v.shape[-1]).T,  # (H, D, C) -> (C, H*D).
}

HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def _to_keras(value, variable, layout):
    if layout.startswith("linear"):
        value = value.T
    return np.reshape(value, tuple(variable.shape))


def _to_hf(variable, layout):
    value = np.asarray(keras_to_numpy(variable))
    return np.ascontiguousarray(LAYOUTS[layout](value))


def _attention_rows(prefix, attention, names, bias=True, conv1d=False):
    """Rows of the four projections of a `MultiHeadAttention`."""
    kernel, output_kernel = ("in_major", "heads_in_major") if conv1d else ("linear", "linear_from_heads")
    rows = []
    projections = (attention.query_dense, attention.key_dense, attention.value_dense)
    for hf, dense in zip(names[:3], projections):
        rows.append((f"{prefix}{hf}.weight", dense.kernel, kernel))
        if bias:
            rows.append((f"{prefix}{hf}.bias", dense.bias, "flat"))
    rows.append((f"{prefix}{names[3]}.weight", attention.output_dense.kernel, output_kernel))
    if bias:
        rows.append((f"{prefix}{names[3]}.bias", attention.output_dense.bias, "copy"))
    return rows


def _norm_rows(prefix, norm):
    if hasattr(norm, "gamma"):  # LayerNormalization
        return [(f"{prefix}.weight", norm.gamma, "copy"), (f"{prefix}.bias", norm.beta, "copy")]
    return [(f"{prefix}.weight", norm.scale, "copy")]  # RMSNormalization


def _dense_rows(prefix, dense, layout="linear"):
    rows = [(f"{prefix}.weight", dense.kernel, layout)]
    if dense.bias is not None:
        rows.append((f"{prefix}.bias", dense.bias, "copy"))
    return rows


def _refuse_options(config, family, computed):
    """Names an option of `config` other than the value the kerasformer model computes.

    Converted anyway, the model would load and give other outputs than the
    checkpoint's, without a word.
    """
    for key, (value, why) in computed.items():
        given = config.get(key, value)
        if given != value:
            raise ValueError(f"{family} `{key}={given!r}` is not supported: {why}.")


# GPT-2 ---------------------------------------------------------------------


_GPT2_COMPUTED = {
    "scale_attn_weights": (True, "kerasformer's attention scales its scores by 1/sqrt(head_dim)"),
    "scale_attn_by_inverse_layer_idx": (False, "kerasformer's GPT scales the scores of every layer alike"),
    "add_cross_attention": (False, "kerasformer's GPT has no cross-attention"),
}


def _gpt2_model(config):
    from kerasformer.models import GPT

    _refuse_options(config, "GPT-2", _GPT2_COMPUTED)
    return GPT(
        vocab_size=config["vocab_size"],
        num_layers=config["n_layer"],
        num_heads=config["n_head"],
        hidden_dim=config["n_embd"],
        intermediate_dim=config.get("n_inner"),
        max_sequence_length=config["n_positions"],
        dropout=config.get("resid_pdrop", 0.1),
        activation=HF_ACTIVATIONS[config.get("activation_function", "gelu_new")],
        norm_epsilon=config.get("layer_norm_epsilon", 1e-5),
        tie_embeddings=config.get("tie_word_embeddings", True) is not False,
    )


def _gpt2_rows(model):
    rows = [
        ("transformer.wte.weight", model.token_embedding.embeddings, "copy"),
        ("transformer.wpe.weight", model.position_embedding.position_embeddings, "copy"),
    ]
    for i, block in enumerate(model.blocks):
        p = f"transformer.h.{i}."
        attention = block.self_attention.sublayer
        ffn = block.feedforward.sublayer
        rows += _norm_rows(p + "ln_1", block.self_attention.norm)
        # c_attn packs q, k and v; `_split_gpt2` unpacks it into these names.
        rows += _attention_rows(p + "attn.", attention, ("q", "k", "v", "c_proj"), conv1d=True)
        rows += _norm_rows(p + "ln_2", block.feedforward.norm)
        rows += _dense_rows(p + "mlp.c_fc", ffn.intermediate_dense, "copy")
        rows += _dense_rows(p + "mlp.c_proj", ffn.output_dense, "copy")
    rows += _norm_rows("transformer.ln_f", model.final_norm)
    if model.lm_head is not None:
        rows.append(("lm_head.weight", model.lm_head.kernel, "linear"))
    return rows


def _split_gpt2(state):
    """Unpacks each Conv1D `c_attn` (C, 3C) into q, k, v entries."""
    state = {("transformer." + k if not k.startswith(("transformer.", "lm_head")) else k): v for k, v in state.items()}
    for key in [k for k in state if k.endswith("attn.c_attn.weight")]:
        prefix = key[: -len("c_attn.weight")]
        weight, bias = state.pop(key), state.pop(prefix + "c_attn.bias")
        for name, w, b in zip("qkv", np.split(weight, 3, axis=1), np.split(bias, 3)):
            state[f"{prefix}{name}.weight"], state[f"{prefix}{name}.bias"] = w, b
    return state


def _merge_gpt2(state):
    for key in [k for k in state if k.endswith("attn.q.weight")]:
        prefix = key[: -len("q.weight")]
        state[prefix + "c_attn.weight"] = np.concatenate(
            [state.pop(f"{prefix}{n}.weight") for n in "qkv"], axis=1
        )
        state[prefix + "c_attn.bias"] = np.concatenate([state.pop(f"{prefix}{n}.bias") for n in "qkv"])
    return state


def _gpt2_config(model):
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": model.vocab_size,
        "n_layer": model.num_layers,
        "n_head": model.num_heads,
        "n_embd": model.hidden_dim,
        "n_inner": model.intermediate_dim,
        "n_positions": model.max_sequence_length,
        "resid_pdrop": model.dropout,
        "embd_pdrop": model.dropout,
        "attn_pdrop": 0.0,
        "activation_function": "gelu_new" if model.activation == "gelu_tanh" else model.activation,
        "layer_norm_epsilon": model.norm_epsilon,
        "tie_word_embeddings": model.tie_embeddings,
    }


# LLaMA: a GPT with rotary positions, RMSNorm and SwiGLU -------------------


def _llama_model(config):
    from kerasformer.models import GPT

    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("head_dim") not in (None, hidden // heads):
        raise ValueError(f"head_dim {config['head_dim']} != hidden_size / num_attention_heads is not supported.")
    # transformers >= 5 keeps the base in `rope_parameters`; earlier ones in `rope_theta`.
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"rope_scaling {rope!r} is not supported; only plain rotary positions.")
    rope_theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    if config.get("attention_bias", False) != config.get("mlp_bias", False):
        raise ValueError("attention_bias and mlp_bias must be equal (`use_bias` covers both).")
    if HF_ACTIVATIONS.get(config.get("hidden_act", "silu")) != "silu":
        raise ValueError(f"hidden_act {config.get('hidden_act')!r} is not supported; LLaMA's is 'silu'.")
    return GPT(
        vocab_size=config["vocab_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        hidden_dim=hidden,
        intermediate_dim=config["intermediate_size"],
        max_sequence_length=config.get("max_position_embeddings", 2048),
        position_type="rotary",
        activation="swiglu",
        norm_type="rms_norm",
        norm_epsilon=config.get("rms_norm_eps", 1e-6),
        tie_embeddings=config.get("tie_word_embeddings", False),
        use_bias=config.get("attention_bias", False),
        num_key_value_heads=config.get("num_key_value_heads") or heads,
        rotary_max_wavelength=rope_theta,
    )


def _llama_rows(model):
    rows = [("model.embed_tokens.weight", model.token_embedding.embeddings, "copy")]
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}."
        ffn = block.feedforward.sublayer
        rows += _norm_rows(p + "input_layernorm", block.self_attention.norm)
        rows += _attention_rows(
            p + "self_attn.", block.self_attention.sublayer, ("q_proj", "k_proj", "v_proj", "o_proj"), bias=model.use_bias
        )
        rows += _norm_rows(p + "post_attention_layernorm", block.feedforward.norm)
        rows += _dense_rows(p + "mlp.gate_proj", ffn.gate_dense)  # act(x W_gate) * (x W_up)
        rows += _dense_rows(p + "mlp.up_proj", ffn.intermediate_dense)
        rows += _dense_rows(p + "mlp.down_proj", ffn.output_dense)
    rows += _norm_rows("model.norm", model.final_norm)
    if model.lm_head is not None:
        rows.append(("lm_head.weight", model.lm_head.kernel, "linear"))
    return rows


def _llama_config(model):
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_dim,
        "intermediate_size": model.blocks[0].feedforward.sublayer.intermediate_dense.units,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_key_value_heads or model.num_heads,
        "max_position_embeddings": model.max_sequence_length,
        "rms_norm_eps": model.norm_epsilon,
        "rope_theta": float(model.rotary_max_wavelength),
        "hidden_act": "silu",
        "tie_word_embeddings": model.tie_embeddings,
        "attention_bias": model.use_bias,
        "mlp_bias": model.use_bias,
    }


# BERT ----------------------------------------------------------------------


_BERT_COMPUTED = {
    "position_embedding_type": ("absolute", "kerasformer's BERT learns absolute positions"),
    "is_decoder": (False, "kerasformer's BERT attends both ways; a decoder's attention is causal"),
}


def _bert_backbone(config):
    from kerasformer.models import BERT

    _refuse_options(config, "BERT", _BERT_COMPUTED)
    return BERT(
        vocab_size=config["vocab_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        hidden_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        max_sequence_length=config["max_position_embeddings"],
        num_segments=config.get("type_vocab_size", 2),
        dropout=config.get("hidden_dropout_prob", 0.1),
        attention_dropout=config.get("attention_probs_dropout_prob", 0.1),
        activation=HF_ACTIVATIONS[config.get("hidden_act", "gelu")],
        norm_epsilon=config.get("layer_norm_eps", 1e-12),
        pad_token_id=config.get("pad_token_id") or 0,
    )


def _bert_model(config):
    from kerasformer.models import BERTClassifier, BERTMaskedLM

    backbone = _bert_backbone(config)
    architecture = (config.get("architectures") or ["BertModel"])[0]
    if architecture == "BertForMaskedLM":
        tied = (True, "kerasformer's BERTMaskedLM predicts with its token table")
        _refuse_options(config, "BERT", {"tie_word_embeddings": tied})
        return BERTMaskedLM(backbone)
    if architecture == "BertForSequenceClassification":
        num_labels = len(config.get("id2label") or {}) or config.get("num_labels", 2)
        dropout = config.get("classifier_dropout")
        return BERTClassifier(
            backbone, num_labels, dropout=config.get("hidden_dropout_prob", 0.1) if dropout is None else dropout
        )
    return backbone


def _bert_rows(model):
    from kerasformer.models import BERTClassifier, BERTMaskedLM

    backbone = getattr(model, "backbone", model)
    rows = [
        ("bert.embeddings.word_embeddings.weight", backbone.token_embedding.embeddings, "copy"),
        ("bert.embeddings.position_embeddings.weight", backbone.position_embedding.position_embeddings, "copy"),
        ("bert.embeddings.token_type_embeddings.weight", backbone.segment_embedding.embeddings, "copy"),
    ]
    rows += _norm_rows("bert.embeddings.LayerNorm", backbone.embedding_norm)
    for i, block in enumerate(backbone.blocks):
        p = f"bert.encoder.layer.{i}."
        rows += _attention_rows(
            p + "attention.", block.self_attention.sublayer,
            ("self.query", "self.key", "self.value", "output.dense"),
        )
        rows += _norm_rows(p + "attention.output.LayerNorm", block.self_attention.norm)
        rows += _dense_rows(p + "intermediate.dense", block.feedforward.sublayer.intermediate_dense)
        rows += _dense_rows(p + "output.dense", block.feedforward.sublayer.output_dense)
        rows += _norm_rows(p + "output.LayerNorm", block.feedforward.norm)
    if isinstance(model, BERTMaskedLM):
        head = model.mlm_head
        rows += _dense_rows("cls.predictions.transform.dense", head.dense)
        rows += _norm_rows("cls.predictions.transform.LayerNorm", head.norm)
        rows.append(("cls.predictions.bias", head.output_bias, "copy"))
    else:
        rows += _dense_rows("bert.pooler.dense", backbone.pooler)
    if isinstance(model, BERTClassifier):
        rows += _dense_rows("classifier", model.classifier)
    return rows


def _split_bert(state):
    return {("bert." + k if k.startswith(("embeddings.", "encoder.", "pooler.")) else k): v for k, v in state.items()}


def _bert_config(model):
    from kerasformer.models import BERTClassifier, BERTMaskedLM

    backbone = getattr(model, "backbone", model)
    architecture = "BertModel"
    extra = {}
    if isinstance(model, BERTMaskedLM):
        architecture = "BertForMaskedLM"
    elif isinstance(model, BERTClassifier):
        architecture = "BertForSequenceClassification"
        extra = {
            "id2label": {str(i): f"LABEL_{i}" for i in range(model.num_classes)},
            "classifier_dropout": model.dropout,
        }
    return {
        "model_type": "bert",
        "architectures": [architecture],
        "vocab_size": backbone.vocab_size,
        "num_hidden_layers": backbone.num_layers,
        "num_attention_heads": backbone.num_heads,
        "hidden_size": backbone.hidden_dim,
        "intermediate_size": backbone.intermediate_dim or 4 * backbone.hidden_dim,
        "max_position_embeddings": backbone.max_sequence_length,
        "type_vocab_size": backbone.num_segments,
        "hidden_dropout_prob": backbone.dropout,
        "attention_probs_dropout_prob": backbone.attention_dropout,
        "hidden_act": "gelu_new" if backbone.activation == "gelu_tanh" else backbone.activation,
        "layer_norm_eps": backbone.norm_epsilon,
        "pad_token_id": backbone.pad_token_id,
        **extra,
    }


# T5 ------------------------------------------------------------------------


def _t5_model(config):
    from kerasformer.models import T5

    gated = config.get("feed_forward_proj", "relu").startswith("gated-")
    activation = HF_ACTIVATIONS[config.get("feed_forward_proj", "relu").split("-")[-1]]
    if gated:
        activation = {"gelu": "geglu_tanh", "gelu_tanh": "geglu_tanh", "relu": "reglu", "silu": "swiglu"}[activation]
    # T5 v1.1 marks its untied head with tie_word_embeddings=False (or, once
    # loaded by transformers 5, scale_decoder_outputs=False).
    tied = config.get("tie_word_embeddings", True) is not False and config.get("scale_decoder_outputs", True)
    return T5(
        vocab_size=config["vocab_size"],
        num_layers=config["num_layers"],
        num_heads=config["num_heads"],
        hidden_dim=config["d_model"],
        intermediate_dim=config["d_ff"],
        head_dim=config["d_kv"],
        num_decoder_layers=config.get("num_decoder_layers"),
        relative_attention_num_buckets=config.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=config.get("relative_attention_max_distance", 128),
        dropout=config.get("dropout_rate", 0.1),
        activation=activation,
        norm_epsilon=config.get("layer_norm_epsilon", 1e-6),
        tie_embeddings=bool(tied),
        pad_token_id=config.get("pad_token_id") or 0,
    )


def _t5_ffn_rows(prefix, ffn):
    if ffn.gated:
        return [
            (prefix + "wi_0.weight", ffn.gate_dense.kernel, "linear"),
            (prefix + "wi_1.weight", ffn.intermediate_dense.kernel, "linear"),
            (prefix + "wo.weight", ffn.output_dense.kernel, "linear"),
        ]
    return [
        (prefix + "wi.weight", ffn.intermediate_dense.kernel, "linear"),
        (prefix + "wo.weight", ffn.output_dense.kernel, "linear"),
    ]


def _t5_rows(model):
    rows = [("shared.weight", model.source_embedding.embeddings, "copy")]
    names = ("q", "k", "v", "o")
    for stack, blocks in (("encoder", model.encoder_blocks), ("decoder", model.decoder_blocks)):
        bias = model.encoder_position_bias if stack == "encoder" else model.decoder_position_bias
        rows.append(
            (f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight", bias.bias_embeddings, "copy")
        )
        for i, block in enumerate(blocks):
            p = f"{stack}.block.{i}.layer."
            rows += _attention_rows(p + "0.SelfAttention.", block.self_attention.sublayer, names, bias=False)
            rows += _norm_rows(p + "0.layer_norm", block.self_attention.norm)
            ffn_index = 1
            if stack == "decoder":
                rows += _attention_rows(p + "1.EncDecAttention.", block.cross_attention.sublayer, names, bias=False)
                rows += _norm_rows(p + "1.layer_norm", block.cross_attention.norm)
                ffn_index = 2
            rows += _t5_ffn_rows(f"{p}{ffn_index}.DenseReluDense.", block.feedforward.sublayer)
            rows += _norm_rows(f"{p}{ffn_index}.layer_norm", block.feedforward.norm)
        final = model.encoder_final_norm if stack == "encoder" else model.decoder_final_norm
        rows += _norm_rows(f"{stack}.final_layer_norm", final)
    if model.lm_head is not None:
        rows.append(("lm_head.weight", model.lm_head.kernel, "linear"))
    return rows


def _split_t5(state):
    state = dict(state)
    state.setdefault("lm_head.weight", state["shared.weight"])  # Tied in the file.
    return state


def _t5_config(model):
    activation = {
        "relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu",
        "geglu_tanh": "gated-gelu", "geglu": "gated-gelu", "reglu": "gated-relu", "swiglu": "gated-silu",
    }[model.activation]
    return {
        "model_type": "t5",
        "architectures": ["T5ForConditionalGeneration"],
        "vocab_size": model.vocab_size,
        "d_model": model.hidden_dim,
        "d_kv": model.encoder_blocks[0].self_attention.sublayer.head_dim,
        "d_ff": model.intermediate_dim or 4 * model.hidden_dim,
        "num_layers": model.num_layers,
        "num_decoder_layers": len(model.decoder_blocks),
        "num_heads": model.num_heads,
        "relative_attention_num_buckets": model.relative_attention_num_buckets,
        "relative_attention_max_distance": model.relative_attention_max_distance,
        "dropout_rate": model.dropout,
        "layer_norm_epsilon": model.norm_epsilon,
        "feed_forward_proj": activation,
        "tie_word_embeddings": model.tie_embeddings,
        "pad_token_id": model.pad_token_id,
        "decoder_start_token_id": model.pad_token_id,
        "eos_token_id": 1,
    }


FAMILIES = {
    "gpt2": (_gpt2_model, _gpt2_rows, _split_gpt2, _merge_gpt2, _gpt2_config),
    "llama": (_llama_model, _llama_rows, dict, dict, _llama_config),
    "bert": (_bert_model, _bert_rows, _split_bert, dict, _bert_config),
    "t5": (_t5_model, _t5_rows, _split_t5, dict, _t5_config),
}


# The GPT options each Hugging Face family fixes; the others are free.
GPT_FAMILIES = {
    "gpt2": dict(position_type="learned", norm_type="layer_norm", norm_first=True, use_bias=True),
    "llama": dict(position_type="rotary", norm_type="rms_norm", norm_first=True, activation="swiglu"),
}


def _gpt_family(model):
    """"gpt2" or "llama": the family whose architecture `model`'s options are."""
    for family, fixed in GPT_FAMILIES.items():
        if any(getattr(model, name) != value for name, value in fixed.items()):
            continue
        if family == "gpt2" and (
            model.activation not in HF_ACTIVATIONS.values() or model.num_key_value_heads not in (None, model.num_heads)
        ):
            continue
        return family
    options = {name: getattr(model, name) for name in (*GPT_FAMILIES["gpt2"], "activation", "num_key_value_heads")}
    raise ValueError(
        f"This GPT's options {options} match no Hugging Face family; expected GPT-2's "
        f"{GPT_FAMILIES['gpt2']} (a plain activation, no grouped-query attention) or LLaMA's {GPT_FAMILIES['llama']}."
    )


# The BERT options a `BertModel` fixes: learned positions, post-norm LayerNorm.
BERT_FIXED = dict(position_type="learned", norm_type="layer_norm", norm_first=False)


def _check_bert(model):
    backbone = getattr(model, "backbone", model)
    options = {name: getattr(backbone, name) for name in (*BERT_FIXED, "activation")}
    if any(options[name] != value for name, value in BERT_FIXED.items()) or backbone.activation not in HF_ACTIVATIONS.values():
        raise ValueError(
            f"This BERT's options {options} match no Hugging Face BERT, which has {BERT_FIXED} and a "
            f"plain activation ({', '.join(sorted(set(HF_ACTIVATIONS.values())))})."
        )


def _check_t5(model):
    if model.activation == "geglu":  # transformers' "gated-gelu" is always the tanh GELU.
        raise ValueError(
            "This T5's `activation='geglu'` (exact GELU) matches no Hugging Face T5, whose gated-gelu "
            "is T5 v1.1's 'geglu_tanh'."
        )


def _family_of(model):
    from kerasformer.models import BERT, GPT, T5, BERTClassifier, BERTMaskedLM

    if isinstance(model, GPT):
        return _gpt_family(model)
    if isinstance(model, (BERT, BERTMaskedLM, BERTClassifier)):
        _check_bert(model)
        return "bert"
    if isinstance(model, T5):
        _check_t5(model)
        return "t5"
    raise ValueError(f"`model` must be a GPT, BERT (or task model) or T5, got {type(model).__name__}.")


def _read(source):
    """`(config, state)` of a transformers model object or a checkpoint folder."""
    if isinstance(source, (str, os.PathLike)):
        folder = os.fspath(source)
        config_path = os.path.join(folder, "config.json")
        if not os.path.isfile(config_path):
            raise ValueError(f"`source` {folder!r} has no config.json; expected a checkpoint folder.")
        with open(config_path) as f:
            config = json.load(f)
        files = sorted(name for name in os.listdir(folder) if name.endswith(".safetensors"))
        if not files:
            raise ValueError(f"`source` {folder!r} has no *.safetensors weights.")
        from safetensors.numpy import load_file

        state = {}
        for name in files:
            state.update(load_file(os.path.join(folder, name)))
        return config, state
    if hasattr(source, "state_dict") and hasattr(source, "config"):
        config = source.config.to_dict()
        config.setdefault("architectures", [type(source).__name__])
        config["architectures"] = [type(source).__name__]
        state = {k: v.detach().cpu().float().numpy() for k, v in source.state_dict().items()}
        return config, state
    raise ValueError(
        "`source` must be a transformers model or a folder with config.json and "
        f"*.safetensors, got {type(source).__name__}."
    )


def from_huggingface(source):
    """Builds the matching kerasformer model and loads the weights of `source`.

    Args:
        source: a `transformers` model object (GPT2Model/GPT2LMHeadModel,
            LlamaForCausalLM,
            BertModel/BertForMaskedLM/BertForSequenceClassification,
            T5ForConditionalGeneration), or a local folder with `config.json`
            and `*.safetensors`.

    Returns:
        A `GPT`, `BERT` / `BERTMaskedLM` / `BERTClassifier`, or `T5`.
    """
    config, state = _read(source)
    family = config.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"Unsupported model_type {family!r}; expected one of {sorted(FAMILIES)}.")
    build, rows, split, _, _ = FAMILIES[family]
    model = build(config)
    state = split(state)
    for name, variable, layout in rows(model):
        if name not in state:
            raise ValueError(f"The checkpoint has no weight {name!r}.")
        value = np.asarray(state[name], dtype="float32")
        expected = int(np.prod(variable.shape))
        if value.size != expected:
            raise ValueError(
                f"Weight {name!r} has shape {value.shape}, which does not fit "
                f"{variable.path} of shape {tuple(variable.shape)}."
            )
        variable.assign(_to_keras(value, variable, layout))
    return model


def to_huggingface(model, path=None):
    """The `(config, state_dict)` of `model` in Hugging Face names and layouts.

    With `path`, also writes `config.json` and `model.safetensors` there,
    loadable by `transformers`' `from_pretrained` and by `from_huggingface`.
    """
    family = _family_of(model)
    from kerasformer.models.base import quantized_layers

    quantized = sorted(quantized_layers(model))
    if quantized:  # Their kernels are integers (or float8) with scales apart: not a float checkpoint.
        raise ValueError(
            f"`model` is quantized ({len(quantized)} layers, e.g. {quantized[0]!r}); write the "
            "float model before `model.quantize` to a Hugging Face checkpoint."
        )
    _, rows, _, merge, make_config = FAMILIES[family]
    state = {name: _to_hf(variable, layout) for name, variable, layout in rows(model)}
    state = merge(state)
    config = make_config(model)
    if path is not None:
        from safetensors.numpy import save_file

        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    return config, state
