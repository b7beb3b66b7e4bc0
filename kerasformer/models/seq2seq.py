"""The encoder-decoder forward pass shared by `T5` and `Transformer`."""

import keras
from keras import ops

from kerasformer.models.base import GenerativeModel, TransformerModel, empty_cache


class EncoderDecoderModel(GenerativeModel):
    """Encoder and decoder stacks; subclasses choose the parts.

    The parts (attributes) are: `source_embedding`, `target_embedding`
    (`TokenEmbedding`s, possibly one layer), `position_encoding` (added to
    embeddings, or None), `encoder_position_bias` / `decoder_position_bias`
    (`RelativePositionBias`, or None), `dropout_layer`, `encoder_blocks`,
    `decoder_blocks`, `encoder_final_norm` / `decoder_final_norm` (or None),
    `lm_head` (None when tied to `target_embedding`), `output_scale`
    (multiplies the decoder output before a tied head, or None), and
    `pad_token_id`. `__init__` runs `encode` and `decode` on a namespace of
    these parts to build the functional graph; generation calls them with
    caches on the model itself.
    """

    def encode(self, encoder_token_ids):
        """Encoder outputs `(B, S, d)` and their padding mask `(B, S)`."""
        padding_mask = ops.not_equal(encoder_token_ids, self.pad_token_id)  # (B, S)
        x = self.source_embedding(encoder_token_ids)  # (B, S, C)
        if self.position_encoding is not None:
            x = x + self.position_encoding(x)
        x = self.dropout_layer(x)
        bias = None if self.encoder_position_bias is None else self.encoder_position_bias(x)
        for block in self.encoder_blocks:
            x = block(x, padding_mask=padding_mask, attention_bias=bias)  # (B, S, C)
        if self.encoder_final_norm is not None:
            x = self.dropout_layer(self.encoder_final_norm(x))
        return x, padding_mask

    def decode(
        self,
        decoder_token_ids,
        encoder_outputs,
        encoder_padding_mask,
        self_attention_cache=None,
        cross_attention_cache=None,
        cache_update_index=None,
        head_kernel=None,
    ):
        """Logits for `decoder_token_ids`, placed at `cache_update_index` with caches.

        Caches are tuples of `(B, 2, K, length, D)` tensors, one per block:
        `self_attention_cache` (from `empty_cache`) is written and returned;
        `cross_attention_cache` (from `cross_attention_cache`) is only read.
        `head_kernel` is `tied_head_kernel()`, computed once by a caller that
        decodes in a loop. Returns `(logits, hidden, cache)`.
        """
        start = 0 if cache_update_index is None else cache_update_index
        x = self.target_embedding(decoder_token_ids)  # (B, T, C)
        if self.position_encoding is not None:
            x = x + self.position_encoding(x, start_index=start)
        x = self.dropout_layer(x)
        bias = None
        if self.decoder_position_bias is not None:
            keys = x if self_attention_cache is None else self_attention_cache[0][:, 0, 0]  # (B, S, D)
            bias = self.decoder_position_bias(x, keys, query_start=start)  # (1, H, T, S)
        caches = []
        for i, block in enumerate(self.decoder_blocks):
            if self_attention_cache is None:
                x = block(
                    x,
                    encoder_outputs,
                    encoder_padding_mask=encoder_padding_mask,
                    self_attention_bias=bias,
                )  # (B, T, C)
            else:
                x, layer_cache = block(
                    x,
                    encoder_padding_mask=encoder_padding_mask,
                    self_attention_bias=bias,
                    self_attention_cache=self_attention_cache[i],
                    cache_update_index=cache_update_index,
                    cross_attention_cache=cross_attention_cache[i],
                )  # (B, T, C), (B, 2, K, S_max, D)
                caches.append(layer_cache)
        if self.decoder_final_norm is not None:
            x = self.dropout_layer(self.decoder_final_norm(x))
        if self.lm_head is not None:
            logits = self.lm_head(x)  # (B, T, V)
        else:
            scaled = x if self.output_scale is None else x * self.output_scale
            logits = self.target_embedding(scaled, reverse=True, transposed_table=head_kernel)  # (B, T, V)
        return logits, x, (tuple(caches) if caches else None)

    def input_vocabularies(self):
        target_name = "target_vocab_size" if getattr(self, "target_vocab_size", None) else "vocab_size"
        return {
            "encoder_token_ids": (self.source_embedding.vocab_size, "vocab_size"),
            "decoder_token_ids": (self.target_embedding.vocab_size, target_name),
        }

    def tied_head_kernel(self):
        """The tied LM head's `(C, V)` kernel (the target table transposed), or None if untied."""
        return None if self.lm_head is not None else self.target_embedding.transposed_table()

    def cross_attention_cache(self, encoder_outputs):
        """Keys and values of the encoder outputs for each decoder block, computed once."""
        return tuple(
            b.cross_attention.sublayer.compute_cache(encoder_outputs) for b in self.decoder_blocks
        )  # (B, 2, K, S, D) per block

    def empty_cache(self, batch_size, max_length):
        """A zero decoder self-attention cache: a `(B, 2, K, max_length, D)` tensor per block."""
        return empty_cache(self.decoder_blocks, batch_size, max_length, self.compute_dtype)

    def _build_graph(self, parts, **kwargs):
        """Builds the functional graph from `parts` and keeps them as attributes."""
        encoder_token_ids = keras.Input((None,), dtype="int32", name="encoder_token_ids")
        decoder_token_ids = keras.Input((None,), dtype="int32", name="decoder_token_ids")
        cls = type(self)
        encoder_outputs, padding_mask = cls.encode(parts, encoder_token_ids)
        logits, _, _ = cls.decode(parts, decoder_token_ids, encoder_outputs, padding_mask)
        TransformerModel.__init__(
            self,
            inputs={"encoder_token_ids": encoder_token_ids, "decoder_token_ids": decoder_token_ids},
            outputs=logits,
            **kwargs,
        )
        for name, value in vars(parts).items():
            setattr(self, name, value)
