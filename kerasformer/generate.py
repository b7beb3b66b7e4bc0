"""Text generation with a KV cache, as one compiled loop per backend.

    new_ids = generate(gpt, [[5, 6, 7], [8, 9]], max_new_tokens=20, temperature=0.8, top_k=40, seed=1)
    new_ids = generate(t5, encoder_token_ids, max_new_tokens=20)
    new_ids = generate(t5, encoder_token_ids, max_new_tokens=20, num_beams=4)

The whole loop (prefill, then one token per step through the cache) is a
`keras.ops.while_loop`, compiled by `jax.jit` on JAX and by
`tf.function(jit_compile=True)` on TensorFlow; on PyTorch the loop runs in
Python under `torch.no_grad()`, and its body (one decoding step) is traced
once per shape with `torch.jit.trace` (`_TorchBody`), so that no token is
re-traced. Compiled loops are cached per shape and option set, so calls with the
same shapes do not recompile; and the lengths are padded (`padded_length`),
so that prompts and sources of other lengths reuse them too: each new length
had cost a compilation (~2 s on TF, ~1 s on JAX for a 4-layer GPT) for a
generation of a few tens of milliseconds.

Sampling draws its random numbers before the loop (from `seed`), and picks
tokens by inverting the CDF of the filtered distribution: the same seed gives
the same tokens, and the loop needs no random state.
"""

import numbers
import warnings
from collections.abc import Iterable

import keras
import numpy as np
from keras import ops

from kerasformer.checks import check_int, check_number, check_positive_int
from kerasformer.layers.embedding import check_token_ids


def filter_logits(logits, top_k=None, top_p=None):
    """Keeps the `top_k` largest logits, then the smallest set of those reaching `top_p` of their mass.

    As `transformers`' `TopKLogitsWarper` then `TopPLogitsWarper`: the
    nucleus is taken of the top k's renormalized distribution (so with both,
    fewer tokens are kept than by a nucleus of the whole distribution).
    `logits` is `(B, V)`; `top_k` (0 = all) and `top_p` (1.0 = all) may be
    tensors. Dropped logits become a large negative number.
    """
    vocab_size = logits.shape[-1]
    if top_k is None and top_p is None:
        return logits
    descending = ops.flip(ops.sort(logits, axis=-1), axis=-1)  # (B, V)
    threshold = descending[:, -1]  # (B,) Keep everything by default.
    if top_k is not None:
        k = ops.cast(top_k, "int32")
        k = ops.where(k > 0, ops.minimum(k, vocab_size), vocab_size)
        threshold = ops.maximum(threshold, ops.take(descending, k - 1, axis=1))
    if top_p is not None:
        ranked = ops.where(descending >= threshold[:, None], descending, -1e9)  # (B, V) the top k, ties kept
        probabilities = ops.softmax(ranked, axis=-1)
        mass_before = ops.cumsum(probabilities, axis=-1) - probabilities  # (B, V)
        top_p = ops.cast(top_p, "float32")
        # The first is always kept; at 1.0 every token (a cumulative sum may round past 1).
        keep = ops.logical_or(mass_before < top_p, top_p >= 1.0)
        # The smallest kept logit is the threshold.
        kept_min = ops.min(ops.where(keep, descending, ops.max(descending)), axis=-1)
        threshold = ops.maximum(threshold, kept_min)
    return ops.where(logits >= threshold[:, None], logits, -1e9)


def sample_tokens(logits, noise, temperature=0.0, top_k=None, top_p=None, greedy=None):
    """Next tokens `(B,)` from `logits` `(B, V)` and uniform `noise` `(B,)`.

    Greedy (argmax) when `temperature` is 0; else samples from
    `softmax(filter(logits / temperature))` by inverting its CDF at `noise`.
    `greedy` (a Python bool) skips the sampling code when known in advance;
    `None` (an exported graph, where `temperature` is an input) decides per
    call, with a conditional, so that greedy requests sort nothing.
    """
    logits = ops.cast(logits, "float32")

    def argmax():
        return ops.cast(ops.argmax(logits, axis=-1), "int32")

    def sampled():
        scaled = logits / ops.maximum(temperature, 1e-6)
        probabilities = ops.softmax(filter_logits(scaled, top_k, top_p), axis=-1)  # (B, V)
        cdf = ops.cumsum(probabilities, axis=-1)
        target = ops.cast(noise, "float32")[:, None] * cdf[:, -1:]
        chosen = ops.sum(ops.cast(cdf < target, "int32"), axis=-1)
        return ops.minimum(chosen, logits.shape[-1] - 1)

    if greedy:
        return argmax()
    temperature = ops.cast(temperature, "float32")
    if greedy is None:
        return ops.cond(temperature > 0, sampled, argmax)
    return sampled()


def _loop_body(step, sampling, pad_token_id):
    """One generation step, as the body of a `while_loop` over `(index, token_ids, done, cache, beams)`.

    `step(ids (B, 1), index, cache, context)` returns the logits `(B, 1, V)`
    of the token at `index` and the updated cache. `inputs` holds what
    every step reads: `(prompt_mask, limits, noise, stop_token_ids, context)`.
    Prompt positions keep their tokens; a row ends at its limit or after a
    stop token, and is padded from there on.
    """

    def body(index, token_ids, done, cache, beams, inputs):
        prompt_mask, limits, noise, stop_token_ids, context = inputs
        batch = ops.shape(token_ids)[0]
        previous = ops.slice(token_ids, (0, index - 1), (batch, 1))  # (B, 1)
        logits, cache = step(previous, index - 1, cache, context)  # (B, 1, V)
        chosen = sample_tokens(logits[:, 0], ops.take(noise, index, axis=1), **sampling)  # (B,)
        in_prompt = ops.take(prompt_mask, index, axis=1)  # (B,)
        past_limit = index >= limits  # (B,)
        chosen = ops.where(ops.logical_or(done, past_limit), pad_token_id, chosen)
        chosen = ops.where(in_prompt, ops.take(token_ids, index, axis=1), chosen)
        token_ids = ops.slice_update(token_ids, (0, index), chosen[:, None])
        stopped = ops.any(chosen[:, None] == stop_token_ids[None, :], axis=-1)
        finished = ops.logical_and(ops.logical_not(in_prompt), stopped)
        done = ops.logical_or(ops.logical_or(done, finished), index + 1 >= limits)
        return index + 1, token_ids, done, cache, beams

    return body


_IMPOSSIBLE = -1e9  # Log-probability of a token a row may not take (finite: no inf - inf).


def _beam_body(step, num_beams, pad_token_id):
    """One step of `transformers`' beam search, over rows `(B * K)`: K running beams per example.

    As `_beam_search` in `transformers` (its default `early_stopping=False`):
    the running beams propose their continuations, and each example keeps
    its best C = max(2, 1 + number of stop ids) * K candidates by summed
    log-probability. Those among the best K that end (a stop token, or the
    row's limit) join the example's K finished hypotheses, scored
    `log-probability / new_length ** length_penalty`; the best K that do not
    end run on, and the cache is gathered from the beams they extend. An
    example is done at its limit, or once its best running beam, scored at
    the current length, cannot beat its worst finished hypothesis
    (Hugging Face's heuristic). Prompt positions force the prompt's token.
    Running scores start at `(0, -1e9, ...)`, so the K copies of a prompt
    branch only once.

    The state's last part is `(running_scores (B, K), finished_ids (B, K, W),
    finished_scores (B, K), finished (B, K), improvable (B,))`; `inputs` ends
    with `(prompt_lengths (B,), length_penalty)`.
    """

    def body(index, token_ids, done, cache, beams, inputs):
        prompt_mask, limits, _, stop_token_ids, context, (prompt_lengths, length_penalty) = inputs
        running_scores, finished_ids, finished_scores, finished, improvable = beams
        examples, rows = ops.shape(running_scores)[0], ops.shape(token_ids)[0]  # B, B*K
        previous = ops.slice(token_ids, (0, index - 1), (rows, 1))  # (B*K, 1)
        logits, cache = step(previous, index - 1, cache, context)  # (B*K, 1, V)
        log_probs = ops.log_softmax(ops.cast(logits[:, 0], "float32"), axis=-1)  # (B*K, V)
        vocab_size = log_probs.shape[-1]
        in_prompt = ops.take(prompt_mask, index, axis=1)  # (B*K,)
        fixed = ops.where(in_prompt, ops.take(token_ids, index, axis=1), pad_token_id)  # (B*K,)
        forced = ops.where(ops.arange(vocab_size)[None, :] == fixed[:, None], 0.0, _IMPOSSIBLE)  # (B*K, V)
        log_probs = ops.where(ops.logical_or(in_prompt, done)[:, None], forced, log_probs)
        candidates = ops.reshape(running_scores, (-1, 1)) + log_probs  # (B*K, V)
        candidates = ops.reshape(candidates, (-1, num_beams * vocab_size))  # (B, K*V)
        # Enough candidates that K of them do not end, whichever stop tokens the beams pick.
        stops = stop_token_ids.shape[0]
        if isinstance(stops, int) and isinstance(num_beams, int):
            count = min(max(2, 1 + stops) * num_beams, num_beams * vocab_size)  # C
        else:  # An exported signature's request gives K and the stop ids.
            stops = ops.shape(stop_token_ids)[0]
            count = ops.minimum(ops.maximum(2, 1 + stops) * num_beams, num_beams * vocab_size)
        top_scores, top = ops.top_k(candidates, count)  # (B, C), best first
        top = ops.cast(top, "int32")
        tokens = ops.mod(top, vocab_size)  # (B, C)
        source = ops.arange(examples, dtype="int32")[:, None] * num_beams + ops.floor_divide(top, vocab_size)  # (B, C) rows they extend
        grown = ops.take(token_ids, ops.reshape(source, (-1,)), axis=0)  # (B*C, W)
        grown = ops.slice_update(grown, (0, index), ops.reshape(tokens, (-1, 1)))

        def per_example(x):  # (B*K,) -> (B,): every beam of an example holds the same value.
            return ops.reshape(x, (-1, num_beams))[:, 0]

        prompt_step, example_done = per_example(in_prompt), per_example(done)  # (B,)
        at_limit = index + 1 >= per_example(limits)  # (B,)
        stopped = ops.any(tokens[:, :, None] == stop_token_ids[None, None, :], axis=-1)  # (B, C)
        ends = ops.logical_and(ops.logical_or(stopped, at_limit[:, None]), ops.logical_not(prompt_step)[:, None])

        # The best K candidates that do not end run on.
        running_scores, picked = ops.top_k(top_scores + ops.cast(ends, "float32") * _IMPOSSIBLE, num_beams)  # (B, K)
        picked = ops.reshape(ops.arange(examples, dtype="int32")[:, None] * count + ops.cast(picked, "int32"), (-1,))  # (B*K,)
        token_ids = ops.take(grown, picked, axis=0)  # (B*K, W)
        origin = ops.take(ops.reshape(source, (-1,)), picked)  # (B*K,)
        cache = tuple(ops.take(layer, origin, axis=0) for layer in cache)  # (B*K, 2, heads, S, D) each

        # Those of the best K that end join the finished hypotheses, if among the K best so far.
        new_length = ops.maximum(ops.cast(index + 1 - prompt_lengths, "float32"), 1.0)  # (B,)
        penalty = ops.power(new_length, ops.cast(length_penalty, "float32"))  # (B,)
        joins = ops.logical_and(ends, (ops.arange(count) < num_beams)[None, :])
        joins = ops.logical_and(joins, ops.logical_and(improvable, ops.logical_not(example_done))[:, None])  # (B, C)
        merged_scores = ops.concatenate([finished_scores, ops.where(joins, top_scores / penalty[:, None], 2 * _IMPOSSIBLE)], 1)
        finished_scores, best = ops.top_k(merged_scores, num_beams)  # (B, K), best first
        best = ops.reshape(ops.arange(examples, dtype="int32")[:, None] * (num_beams + count) + ops.cast(best, "int32"), (-1,))
        width = ops.shape(token_ids)[1]
        merged_ids = ops.concatenate([finished_ids, ops.reshape(grown, (examples, count, width))], axis=1)  # (B, K+C, W)
        finished_ids = ops.reshape(ops.take(ops.reshape(merged_ids, (-1, width)), best, axis=0), (examples, num_beams, width))
        finished = ops.reshape(ops.take(ops.reshape(ops.concatenate([finished, joins], 1), (-1,)), best), (examples, num_beams))

        # Hugging Face's heuristic: could the best running beam still beat the worst finished one?
        worst = ops.where(finished, ops.min(finished_scores, axis=1, keepdims=True), _IMPOSSIBLE)  # (B, K)
        hopeful = ops.any((running_scores[:, 0] / penalty)[:, None] > worst, axis=1)  # (B,)
        # (B,): the reshape keeps the rank known to TF's loop when K is a tensor (an exported signature's input).
        improvable = ops.reshape(ops.where(prompt_step, improvable, ops.logical_and(improvable, hopeful)), (-1,))
        ended = ops.logical_and(ops.logical_not(prompt_step), ops.logical_or(at_limit, ops.logical_not(improvable)))
        done = ops.repeat(ops.logical_or(example_done, ended), num_beams)  # (B*K,)
        return index + 1, token_ids, done, cache, (running_scores, finished_ids, finished_scores, finished, improvable)

    return body


def _is_beam_search(num_beams):
    """Beam search for K > 1 beams; a tensor K (an exported signature's input) always takes the beam loop."""
    return not isinstance(num_beams, numbers.Integral) or num_beams > 1


class _TorchBody:
    """The loop body traced once per shape with `torch.jit.trace`.

    Eager Keras spends most of a decoding step in Python (layer calls, dtype
    checks); the trace replays only the tensor operations. Traces read the
    model's parameters, and are rebuilt when a weight tensor is replaced.

    torch 2.13 deprecates `torch.jit.trace` in favour of `torch.compile` and
    `torch.export`, but neither replaces it here: on 2 CPU cores (GPT, 4
    layers, width 256, batch 1) the traced body decodes 222 new tokens/s,
    `torch.compile` 126 (eager backend) to 178 (inductor) after a 20-40 s first
    call, and `torch.export` refuses the loop's data-dependent cache index.
    Where tracing fails (a torch without it; Python 3.14+, which torch says it
    may not support), the body runs eagerly, with a warning: slower, same
    tokens.
    """

    def __init__(self, body, model):
        import torch

        class Body(torch.nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model  # Registers the parameters with the trace.

            def forward(self, index, token_ids, done, cache, beams, inputs):
                return body(index, token_ids, done, cache, beams, inputs)

        self.module = Body(model)
        self.model = model
        self.traced = {}
        self.trace_count = 0
        self.eager = False  # Set when tracing failed: every shape runs eagerly.

    def _key(self, state, inputs):
        import torch

        shapes = tuple(tuple(t.shape) for t in torch.utils._pytree.tree_leaves((state, inputs)))
        weights = tuple(id(v.value) for v in self.model.variables)
        return shapes, weights

    def _trace(self, example):
        import torch

        try:
            with warnings.catch_warnings():
                # Shape checks inside Keras ops become constants: right, as
                # each trace serves one set of shapes.
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                # Kept on purpose (see the class docstring); the user cannot act on it.
                warnings.filterwarnings("ignore", "`torch.jit.trace", DeprecationWarning)
                return torch.jit.trace(self.module, example, check_trace=False)
        except Exception as error:  # Any failure of the tracer: eager steps are still right.
            warnings.warn(
                f"generate() runs its decoding steps eagerly on this torch "
                f"(several times slower): torch.jit.trace failed: {type(error).__name__}: {error}",
                RuntimeWarning,
                stacklevel=2,
            )
            self.eager = True
            return self.module

    def __call__(self, *state_and_inputs):
        if self.eager:
            return self.module(*state_and_inputs)
        key = self._key(state_and_inputs[:-1], state_and_inputs[-1])
        if key not in self.traced:
            self.traced = {key: self._trace(state_and_inputs)}
            self.trace_count += 1
        return self.traced[key](*state_and_inputs)


class Generator:
    """Compiled generation for one model; `generate` keeps one per model.

    Args:
        model: a `GPT`, `T5` or `Transformer`.
    """

    def __init__(self, model):
        from kerasformer.models.gpt import GPT
        from kerasformer.models.seq2seq import EncoderDecoderModel

        if isinstance(model, GPT):
            self.kind = "decoder"
        elif isinstance(model, EncoderDecoderModel):
            self.kind = "seq2seq"
        else:
            raise ValueError(
                f"`model` must be a GPT, T5 or Transformer, got {type(model).__name__}."
            )
        self.model = model
        self._compiled = {}
        self._torch_body = None
        self.trace_count = 0  # How many times a loop was traced (compiled).

    # The loop, written once in keras.ops ------------------------------------

    def _step(self):
        """`step(ids, index, cache, context)` for this kind of model."""
        model = self.model
        if self.kind == "decoder":

            def step(ids, index, cache, context):
                head_kernel = context[0] if context else None
                logits, _, cache = model.compute_logits(ids, cache, index, head_kernel=head_kernel)
                return logits, cache

        else:

            def step(ids, index, cache, context):
                encoder_mask, cross_cache, *head = context
                head_kernel = head[0] if head else None
                logits, _, cache = model.decode(
                    ids, None, encoder_mask, cache, cross_cache, index, head_kernel=head_kernel
                )
                return logits, cache

        return step

    def _loop(
        self, body, encoder_token_ids, token_ids, prompt_mask, limits, noise, start, stop_token_ids, prefill_ids=None,
        length_penalty=1.0, num_beams=1,
    ):
        """Prefill, then `body` until every row is done; returns the rows' `token_ids` `(B, L)`.

        A GPT's cache is prefilled from `prefill_ids` `(B, P)`, the first P
        tokens of `token_ids` with P at least `start - 1` (the loop rewrites
        every position from `start - 1` on), or from all of `token_ids`.
        With `num_beams` K > 1 every example runs as K rows (its beams), and
        its row of the result is its best finished hypothesis; K may be a
        scalar tensor (the exported `beam_search`'s input), where shapes
        are dynamic anyway.
        """
        self.trace_count += 1
        model = self.model
        examples = ops.shape(token_ids)[0]
        prefill_ids = token_ids if prefill_ids is None else prefill_ids
        beam = _is_beam_search(num_beams)
        if beam:
            repeat = lambda x: ops.repeat(x, num_beams, axis=0)  # noqa: E731
            token_ids, prompt_mask, limits, noise, prefill_ids = map(
                repeat, (token_ids, prompt_mask, limits, noise, prefill_ids)
            )
        batch, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]  # Dynamic when exported.
        cache = model.empty_cache(batch, length)
        # Transposed once, before the loop: inside it XLA copied the transposed
        # table on every token (8 MB at V=8192, C=256), as KerasHub's loop does.
        head_kernel = model.tied_head_kernel()  # (C, V), or None when untied
        head = () if head_kernel is None else (head_kernel,)  # No None in the loop's inputs (torch traces them).
        if self.kind == "decoder":
            _, _, cache = model.compute_logits(prefill_ids, cache, 0)  # (B, P) positions of the cache
            context = head
        else:
            encoder_outputs, encoder_mask = model.encode(encoder_token_ids)
            context = (encoder_mask, model.cross_attention_cache(encoder_outputs))
            if beam:  # Encoded once per example; its beams share it.
                context = keras.tree.map_structure(repeat, context)
            context += head
        inputs = (prompt_mask, limits, noise, stop_token_ids, context)
        done = ops.zeros((batch,), "bool")
        beams = ops.zeros((batch,), "int32")  # Sampling keeps no state of its own (a tensor, as torch traces only those).
        if beam:
            prompt_lengths = ops.sum(ops.cast(prompt_mask, "int32"), axis=1)[::num_beams]  # (B,)
            inputs += ((prompt_lengths, ops.cast(length_penalty, "float32")),)
            running_scores = ops.cast(ops.where(ops.arange(num_beams) == 0, 0.0, _IMPOSSIBLE), "float32")
            beams = (
                ops.tile(running_scores[None, :], (examples, 1)),  # (B, K) summed log-probabilities
                ops.zeros((examples, num_beams, length), "int32"),  # finished hypotheses
                ops.full((examples, num_beams), _IMPOSSIBLE, "float32"),  # their length-penalized scores
                ops.zeros((examples, num_beams), "bool"),  # which of them are filled
                ops.ones((examples,), "bool"),  # can an example's hypotheses still improve?
            )

        def cond(index, token_ids, done, cache, beams):
            return ops.logical_and(index < length, ops.logical_not(ops.all(done)))

        state = (start, token_ids, done, cache, beams)
        if self._torch_body is not None:  # PyTorch: a Python loop over the traced body.
            while bool(cond(*state)):
                state = self._torch_body(*state, inputs)
        else:
            state = ops.while_loop(cond, lambda *state: body(*state, inputs), state)
        return state[4][1][:, 0] if beam else state[1]  # (B, L)

    # Compilation per backend ------------------------------------------------

    def _pad_token_id(self):
        """What follows a row's stop token: 0 for a GPT, a T5's or Transformer's pad id."""
        return 0 if self.kind == "decoder" else self.model.pad_token_id

    def _function(self, sampling_key, sampling, num_beams=1):
        key = (sampling_key, num_beams)
        if key in self._compiled:
            return self._compiled[key]
        pad_token_id = self._pad_token_id()
        if num_beams > 1:
            body = _beam_body(self._step(), num_beams, pad_token_id)
        else:
            body = _loop_body(self._step(), sampling, pad_token_id)

        def run(*args):
            return self._loop(body, *args, num_beams=num_beams)

        backend = keras.backend.backend()
        if backend == "jax":
            import jax

            variables = self.model.variables

            @jax.jit
            def compiled(values, *args):
                with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                    return run(*args)

            function = lambda *args: compiled([v.value for v in variables], *args)  # noqa: E731
        elif backend == "tensorflow":
            import tensorflow as tf

            function = tf.function(run, jit_compile=True, autograph=False)  # Plain TF ops: no AST rewrite to pay for.
        else:
            import torch

            torch_body = _TorchBody(body, self.model)

            def function(*args):
                self._torch_body = torch_body
                args = [torch.as_tensor(a) if isinstance(a, (np.ndarray, np.generic)) else a for a in args]
                try:
                    with torch.no_grad():
                        return run(*args)
                finally:
                    self._torch_body = None

        self._compiled[key] = function
        return function

    def __call__(
        self,
        inputs,
        max_new_tokens=32,
        temperature=0.0,
        top_k=None,
        top_p=None,
        stop_token_ids=(),
        seed=None,
        start_token_id=None,
        num_beams=1,
        length_penalty=1.0,
    ):
        """See `generate`."""
        check_positive_int("max_new_tokens", max_new_tokens)
        check_positive_int("num_beams", num_beams)
        check_number("temperature", temperature, low=0)
        check_int("top_k", top_k, none_ok=True)
        check_number("top_p", top_p, low=0, high=1, low_open=True, none_ok=True)
        check_int("seed", seed, none_ok=True)  # numpy's generators take no negative seed.
        check_number("length_penalty", length_penalty)
        if num_beams > 1 and (temperature or top_k or top_p not in (None, 1.0)):
            raise ValueError(
                "Beam search is deterministic: with `num_beams` > 1 leave `temperature` at 0 "
                "and `top_k` / `top_p` unset."
            )
        vocab_size = self.model.vocab_size if self.kind == "decoder" else self.model.target_embedding.vocab_size
        if isinstance(stop_token_ids, numbers.Integral):  # One stop token, as `transformers`' `eos_token_id` takes it.
            stop_token_ids = [stop_token_ids]
        if isinstance(stop_token_ids, (str, bytes)) or not isinstance(stop_token_ids, Iterable):
            raise ValueError(f"`stop_token_ids` must be a list of token ids, got {stop_token_ids!r}.")
        stop_token_ids = list(stop_token_ids)  # Read once: an iterator checked here would reach the loop empty.
        for token_id in stop_token_ids:
            check_int("stop_token_ids", token_id, high=vocab_size)  # An id past the vocabulary would never stop a row.
        check_int("start_token_id", start_token_id, high=vocab_size, none_ok=True)
        if self.kind == "decoder" and start_token_id is not None:  # It would be ignored: a GPT continues its prompt.
            raise ValueError("`start_token_id` starts a T5's or Transformer's decoder; a GPT continues its prompt: leave it unset.")
        greedy = temperature == 0
        use_top_k = not greedy and bool(top_k)
        use_top_p = not greedy and top_p not in (None, 1.0)
        # Values travel as tensors, so that changing them does not recompile.
        sampling = {
            "greedy": greedy,
            "temperature": np.float32(temperature),
            "top_k": np.int32(top_k) if use_top_k else None,
            "top_p": np.float32(top_p) if use_top_p else None,
        }
        stop = np.asarray(list(stop_token_ids) or [-1], "int32")
        function = self._function((greedy, use_top_k, use_top_p), sampling, num_beams)
        model = self.model

        if self.kind == "decoder":
            prompts = _as_rows(inputs, "inputs", model.vocab_size, "prompt")
            total = max(len(p) for p in prompts) + max_new_tokens
            table = model.max_sequence_length  # Its context; learned positions end there.
            if total > table:
                if num_beams > 1:
                    raise ValueError(
                        f"Beam search must fit the context: prompt ({total - max_new_tokens}) + "
                        f"`max_new_tokens` ({max_new_tokens}) = {total} > max_sequence_length={table}."
                    )
                return self._slide(function, prompts, max_new_tokens, table, seed, stop)
            return self._decode(function, prompts, max_new_tokens, total, seed, stop, num_beams, length_penalty)
        sources = _as_rows(inputs, "inputs", model.source_embedding.vocab_size, "source")
        longest = max(len(s) for s in sources)
        # The decoder reads its start token and every new token but the last.
        for length, what in ((longest, "`inputs`"), (max_new_tokens, "`max_new_tokens`")):
            message = learned_positions_message(model, what)
            if message and length > model.max_sequence_length:
                raise ValueError(message)
        # Shorter sources are padded with the pad id, which the encoder masks.
        width = padded_length(longest, learned_position_limit(model))
        encoder_ids = np.full((len(sources), width), model.pad_token_id, "int32")
        for row, source in enumerate(sources):
            encoder_ids[row, : len(source)] = source
        lengths = np.ones((encoder_ids.shape[0],), "int32")
        # Positions no token is written to (after a stop token) keep the pad id.
        token_ids = np.full((encoder_ids.shape[0], 1 + max_new_tokens), model.pad_token_id, "int32")
        token_ids[:, 0] = model.pad_token_id if start_token_id is None else start_token_id
        return self._run(function, encoder_ids, token_ids, lengths, max_new_tokens, seed, stop, num_beams, length_penalty)

    def _decode(self, function, prompts, max_new_tokens, total, seed, stop, num_beams=1, length_penalty=1.0):
        """GPT: `max_new_tokens` (an int, or one per row) after each prompt, in a `(B, total)` buffer.

        A fixed `total` compiles one loop for every call.
        """
        token_ids = np.zeros((len(prompts), total), "int32")
        for row, prompt in enumerate(prompts):
            token_ids[row, : len(prompt)] = prompt
        lengths = np.array([len(p) for p in prompts], "int32")
        encoder_ids = np.zeros((len(prompts), 1), "int32")  # Unused.
        return self._run(function, encoder_ids, token_ids, lengths, max_new_tokens, seed, stop, num_beams, length_penalty)

    def _run(self, function, encoder_ids, token_ids, lengths, max_new_tokens, seed, stop, num_beams, length_penalty):
        """The compiled loop over `token_ids` whose rows hold `lengths` given tokens.

        Returns the new tokens `(B, N)`, N the largest of `max_new_tokens`
        (an int, or one per row); a row's tokens past its own count are pads.
        """
        batch, total = token_ids.shape
        limit = self.model.max_sequence_length if self.kind == "decoder" else learned_position_limit(self.model)
        width = padded_length(total, limit)  # Rows end at their limits, not at the buffer's end.
        token_ids = np.pad(token_ids, [(0, 0), (0, width - total)], constant_values=self._pad_token_id())  # (B, W)
        counts = np.broadcast_to(np.asarray(max_new_tokens, "int32"), lengths.shape)
        prompt_mask = np.arange(width)[None, :] < lengths[:, None]  # (B, W)
        # Drawn at the unpadded shape: the same seed gives the same tokens at any padding.
        noise = np.random.default_rng(seed).random((batch, total), dtype=np.float32)
        noise = np.pad(noise, [(0, 0), (0, width - total)])  # (B, W)
        start = int(lengths.min())
        # A GPT prefills its shortest prompt's positions (padded too); the loop does the rest.
        prefill_ids = token_ids[:, : padded_length(start, width)] if self.kind == "decoder" else None  # (B, P)
        result = function(
            encoder_ids, token_ids, prompt_mask, (lengths + counts).astype("int32"), noise, np.int32(start), stop,
            prefill_ids, np.float32(length_penalty),
        )
        result = keras.ops.convert_to_numpy(result)  # (B, W)
        new = np.zeros((len(result), int(counts.max())), "int32")
        for row, (n, count) in enumerate(zip(lengths, counts)):
            new[row, :count] = result[row, n : n + count]
        return new

    def _slide(self, function, prompts, max_new_tokens, window, seed, stop):
        """GPT past its context (`max_sequence_length`): generation in windows, as nanoGPT crops its context.

        Learned positions cannot go further; rotary ones were not trained further.

        A row's first window holds its prompt's last `window - 1` tokens and
        is filled up with new ones; each later window starts afresh from the
        text's last `window // 2` tokens, so every new token sees between half
        a context and a whole one, and a window's tokens come from the KV
        cache. Rows keep their own windows (a text is the same as if
        generated alone); every window has the context's shape, so one
        compiled loop serves all. A row that stops is padded from there on.
        """
        if window < 2:
            raise ValueError(NO_ROOM.format(window))
        keep = window // 2
        texts = [[int(t) for t in prompt] for prompt in prompts]
        new = np.zeros((len(texts), max_new_tokens), "int32")
        produced, done = np.zeros(len(texts), "int32"), np.zeros(len(texts), bool)
        for part_number in range(max_new_tokens):  # Ends far sooner: every window adds at least one token.
            active = ~done & (produced < max_new_tokens)
            if not active.any():
                break
            contexts = [text[-(window - 1 if n == 0 else keep):] for text, n in zip(texts, produced)]
            counts = np.where(active, np.minimum(max_new_tokens - produced, window - np.array([len(c) for c in contexts])), 0)
            part_seed = None if seed is None else [seed, part_number]  # Each window its own draws.
            part = self._decode(function, contexts, counts, window, part_seed, stop)  # (B, max(counts))
            for row in np.flatnonzero(active):
                tokens = part[row, : counts[row]]
                stops = np.flatnonzero(np.isin(tokens, stop))
                if len(stops):
                    tokens, done[row] = tokens[: stops[0] + 1], True
                new[row, produced[row] : produced[row] + len(tokens)] = tokens
                texts[row] += tokens.tolist()
                produced[row] += counts[row]
        return new


# A GPT of a 1-token context (`max_sequence_length`) cannot generate: the exported `generate` says the same.
NO_ROOM = "A GPT with max_sequence_length={} has no room for a prompt and a new token."


def padded_length(length, limit=None):
    """`length` padded up to 16, 32, 64, then a multiple of 64, but not past `limit`.

    Generation pads its buffers to these lengths, so that one compiled loop
    serves a range of prompt or source lengths. Padding costs each step the
    masked cache positions it reads (a 136-token text padded to 192 took
    3-12% longer a step, 2 CPU cores, batch 1 and 8), so it stays under 64
    positions.
    """
    length = int(length)
    padded = max(16, 1 << (length - 1).bit_length()) if length <= 64 else -(-length // 64) * 64
    return padded if limit is None else max(length, min(padded, limit))


def learned_position_limit(model):
    """The length of `model`'s learned position table; None when it has none (nothing to exceed)."""
    return model.max_sequence_length if getattr(model, "position_type", None) == "learned" else None


def learned_positions_message(model, what):
    """The error for `what` past `model`'s learned position table; None when it has none."""
    limit = learned_position_limit(model)
    if limit is None:
        return None
    return f"{what} must fit the learned positions: at most {limit} tokens (max_sequence_length={limit})."


def _as_rows(inputs, name, vocab_size, what):
    """Token id rows (a 2-D array or tensor, or a list of lists) as 1-D int32 arrays, checked.

    The ids are checked in their own dtype, so that floats and ids past int32
    are refused rather than cast.
    """
    if keras.ops.is_tensor(inputs):
        inputs = keras.ops.convert_to_numpy(inputs)
    if isinstance(inputs, np.ndarray) and inputs.ndim == 2:
        rows = list(inputs)
    elif isinstance(inputs, (list, tuple)) and inputs and all(isinstance(row, (list, tuple, np.ndarray)) for row in inputs):
        rows = [np.asarray(row) for row in inputs]
    else:
        rows = []
    if not rows or any(row.ndim != 1 for row in rows):
        raise ValueError(f"`{name}` must be a batch of token id {what}s: a 2-D array or a list of lists.")
    if any(row.size == 0 for row in rows):
        raise ValueError(f"Each {what} in `{name}` needs at least one token.")
    check_token_ids(np.concatenate(rows), vocab_size, name)
    return [row.astype("int32") for row in rows]


def generate(model, inputs, max_new_tokens=32, **options):
    """Generates `max_new_tokens` tokens per example with the KV cache.

    Args:
        model: a `GPT`, `T5` or `Transformer`.
        inputs: a `(B, T)` array or a list of token id lists of different
            lengths: for GPT, prompts; for T5/Transformer, encoder token ids
            (shorter sources are padded with the pad id, which the encoder
            masks).
        max_new_tokens: tokens to generate per example. A GPT generates past
            its context (`max_sequence_length`) in windows, as nanoGPT crops
            its context: a longer prompt counts by its last
            `max_sequence_length - 1` tokens, and once a window is full the
            next starts from the text's last half context (beam search
            must fit the context).
        temperature: 0 (default) for greedy decoding; > 0 to sample.
        top_k: sample among the k most likely tokens (0 or None: all).
        top_p: sample from the smallest set with this probability mass (of
            the top k's renormalized distribution when `top_k` is set).
        stop_token_ids: a row ends after emitting one of these; later
            positions hold the pad id (0).
        seed: seeds the sampling; the same seed gives the same tokens.
        start_token_id: first decoder token of T5/Transformer (default: the
            pad id, as T5 does).
        num_beams: beam search with this many beams per example (1: off),
            as `transformers`' `generate(num_beams=...)`: a beam that emits a
            stop token becomes a finished text and leaves its place to the
            next best running beam. Deterministic; cannot be combined with
            sampling options.
        length_penalty: beam search ranks finished texts by
            `log-probability / new_length ** length_penalty` (Hugging Face's
            rule; > 0 favours longer outputs).

    Returns:
        `(B, max_new_tokens)` int32 numpy array of new tokens (without the
        prompt), padded after a stop token.
    """
    generator = getattr(model, "_kerasformer_generator", None)
    if generator is None or generator.model is not model:
        generator = Generator(model)
        object.__setattr__(model, "_kerasformer_generator", generator)
    return generator(inputs, max_new_tokens=max_new_tokens, **options)
