"""The encoder architectures mlmkit trains, and where each keeps its parts.

The training objective, the loaders, the fine-tuning and the export reach the encoder,
the MLM head and the output bias through ``parts_of(model)``, so they need no branch per
architecture:

- ``bert``: transformers' ``BertForMaskedLM`` (Devlin et al., 2019): learned positions,
  post-normalisation, a GELU FFN, token type embeddings. Encoder ``.bert``, head ``.cls``.
- ``modernbert``: transformers' ``ModernBertForMaskedLM`` (Warner et al., 2024, 'Smarter,
  Better, Faster, Longer'): rotary positions, pre-normalisation, a GeGLU FFN, no biases
  (but the decoder's), local attention (a sliding window) in all layers but every
  ``global_attn_every_n_layers``-th, no token types. Encoder ``.model``, head ``.head``
  then ``.decoder`` (tied to the input embeddings).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mlmkit.errors import ConfigError

# The local heads' query/key weights (``Bert.init_attention``): their attention logits reach
# a few nats between the neighbour and the other positions; twice as much learned slower
# (docs/recipes.md, stage 6).
LOCAL_HEAD_SCALE = 1.5


def sinusoid_rates(width: int) -> torch.Tensor:
    """Return the angular rates of the sine/cosine pairs of a width-``width`` sinusoidal position
    table (Vaswani et al., 2017): pair k (dims 2k and 2k + 1) turns 10000^(-2k/width) per
    position."""
    return 10000.0 ** (-torch.arange(0, width, 2, dtype=torch.float32) / width)


class Bert:
    name = "bert"
    masked_lm = "BertForMaskedLM"
    sequence_classification = "BertForSequenceClassification"
    token_classification = "BertForTokenClassification"  # a label per token (NER, POS)
    question_answering = "BertForQuestionAnswering"  # an answer span's start and end
    takes_token_type_ids = True
    # stored once: the decoder's weight is the word embeddings, its bias the head's bias
    tied_keys = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
    layer_class = "BertLayer"  # one FSDP unit each
    # the modules a sequence classifier (or a token classifier, a span extractor) takes from the
    # masked-LM model (the sequence classifier's pooler is new)
    shared_with_classifier = ("bert",)

    @staticmethod
    def config(cfg, vocab_size: int, tokenizer):
        from transformers import BertConfig

        return BertConfig(
            vocab_size=vocab_size,
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads,
            intermediate_size=cfg.intermediate_size,
            hidden_act="gelu",
            hidden_dropout_prob=cfg.hidden_dropout_prob,
            attention_probs_dropout_prob=cfg.attention_probs_dropout_prob,
            max_position_embeddings=cfg.max_position_embeddings,
            type_vocab_size=cfg.type_vocab_size,
            initializer_range=cfg.initializer_range,
            layer_norm_eps=cfg.layer_norm_eps,
            pad_token_id=tokenizer.pad_token_id,
            is_decoder=False,
        )

    @staticmethod
    @torch.no_grad()
    def init_positions(model, how: str) -> None:
        """``model.position_init``: "sinusoidal" refills the position table with sines and
        cosines of geometrically spaced wavelengths, scaled to ``initializer_range``."""
        if how != "sinusoidal":
            return
        table = model.bert.embeddings.position_embeddings.weight
        n, d = table.shape
        position = torch.arange(n, dtype=torch.float32)[:, None]
        rate = sinusoid_rates(d)
        waves = torch.zeros(n, d)
        waves[:, 0::2] = torch.sin(position * rate)
        waves[:, 1::2] = torch.cos(position * rate[: d // 2])
        table.copy_(waves * (model.config.initializer_range / waves.std()))

    @staticmethod
    @torch.no_grad()
    def init_attention(model, how: str) -> None:
        """``model.attention_init``: "local" starts half the heads of every layer (at least
        two) as previous-token and next-token heads, in turn, the rest as BERT's init.

        With the sinusoidal position table, the position ``t + s`` is a fixed rotation of
        position ``t`` in each sine/cosine pair (Vaswani et al., 2017). Such a head's query
        reads ``dh/2`` pairs of the layer's input and its key reads them rotated by ``s`` =
        -1 or +1, so a token's query meets its neighbour's key most. The word and token-type
        embeddings start at zero in the dims of those pairs (the table's fastest-turning
        ones), so the heads see the positions alone; else a token's own embedding, which
        its query and key share, draws the head onto the token itself. The head then
        attends to its neighbour from the first step (about half its weight; the rest on
        the next ones out), as trained BERTs' heads often do (Clark et al., 2019, 'What
        Does BERT Look At?'), and the value/output weights learn what to take from it
        instead of the queries and keys first having to find it. Only the start differs:
        the weights are trained like all others and the model is a plain
        ``BertForMaskedLM``."""
        if how != "local":
            return
        d, heads = model.config.hidden_size, model.config.num_attention_heads
        dh = d // heads
        local = min(heads, max(2, heads // 2)) // 2 * 2  # previous/next pairs
        groups = local // 2
        rate = sinusoid_rates(d)
        for layer in model.bert.encoder.layer:
            query, key = layer.attention.self.query, layer.attention.self.key
            for h in range(local):
                pairs = torch.arange(dh // 2) * groups + h // 2  # spread over the spectrum
                angle = rate[pairs] * (1 if h % 2 == 0 else -1)
                rows = torch.arange(dh // 2) * 2 + h * dh
                sin_col, cos_col = 2 * pairs, 2 * pairs + 1
                for tensor in (query.weight, key.weight, query.bias, key.bias):
                    tensor[h * dh : (h + 1) * dh] = 0.0
                query.weight[rows, sin_col] = LOCAL_HEAD_SCALE
                query.weight[rows + 1, cos_col] = LOCAL_HEAD_SCALE
                # the key is the input rotated by `angle`: (sin, cos)(a) -> (sin, cos)(a + angle)
                key.weight[rows, sin_col] = LOCAL_HEAD_SCALE * torch.cos(angle)
                key.weight[rows, cos_col] = LOCAL_HEAD_SCALE * torch.sin(angle)
                key.weight[rows + 1, sin_col] = -LOCAL_HEAD_SCALE * torch.sin(angle)
                key.weight[rows + 1, cos_col] = LOCAL_HEAD_SCALE * torch.cos(angle)
        if local:
            read = 2 * groups * (dh // 2)  # the pairs the local heads read: dims 0 .. read - 1
            embeddings = model.bert.embeddings
            embeddings.word_embeddings.weight[:, :read] = 0.0
            embeddings.token_type_embeddings.weight[:, :read] = 0.0

    @staticmethod
    def sequence_classifier(config, pooling: str):
        """``BertForSequenceClassification`` on the [CLS] state, or on the mean token state."""
        if pooling == "mean":
            from mlmkit.model.classifier import MeanPoolBertForSequenceClassification

            return MeanPoolBertForSequenceClassification(config)
        return transformers_class(Bert.sequence_classification)(config)

    @staticmethod
    def token_classifier(config):
        """``BertForTokenClassification``: a label per token state."""
        return transformers_class(Bert.token_classification)(config)

    @staticmethod
    def question_answerer(config):
        """``BertForQuestionAnswering``: start and end logits per token state."""
        config.num_labels = 2
        return transformers_class(Bert.question_answering)(config)

    @staticmethod
    def encoder(model) -> nn.Module:
        return model.bert

    @staticmethod
    def layers(model) -> nn.ModuleList:
        return model.bert.encoder.layer

    @staticmethod
    def head(model, hidden):
        return model.cls(hidden)

    @staticmethod
    def output_bias(model):
        return model.cls.predictions.bias

    @staticmethod
    def embeddings(model) -> nn.Module:
        return model.bert.embeddings

    @staticmethod
    def set_dropout(model, hidden: float, attention: float) -> None:
        model.config.hidden_dropout_prob = hidden
        model.config.attention_probs_dropout_prob = attention
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = hidden
        for layer in model.bert.encoder.layer:
            layer.attention.self.dropout.p = attention


class ModernBert:
    name = "modernbert"
    masked_lm = "ModernBertForMaskedLM"
    sequence_classification = "ModernBertForSequenceClassification"
    token_classification = "ModernBertForTokenClassification"
    question_answering = "ModernBertForQuestionAnswering"
    takes_token_type_ids = False
    tied_keys = ("decoder.weight",)
    layer_class = "ModernBertEncoderLayer"  # one FSDP unit each
    # the encoder, and the MLM head's dense + norm, which the classifier applies to the pooled
    # state (the token and span heads to every token's state; the same names in both models,
    # as transformers' from_pretrained would carry them)
    shared_with_classifier = ("model", "head")

    @staticmethod
    def init_positions(model, how: str) -> None:
        """Rotary positions: no table to initialise."""

    @staticmethod
    def init_attention(model, how: str) -> None:
        """Rotary positions: no position table for local heads to start from."""

    @staticmethod
    def config(cfg, vocab_size: int, tokenizer):
        from transformers import ModernBertConfig

        return ModernBertConfig(
            vocab_size=vocab_size,
            hidden_size=cfg.hidden_size,
            num_hidden_layers=cfg.num_hidden_layers,
            num_attention_heads=cfg.num_attention_heads,
            intermediate_size=cfg.intermediate_size,
            max_position_embeddings=cfg.max_position_embeddings,
            initializer_range=cfg.initializer_range,
            norm_eps=cfg.layer_norm_eps,
            embedding_dropout=cfg.hidden_dropout_prob,
            mlp_dropout=cfg.hidden_dropout_prob,
            attention_dropout=cfg.attention_probs_dropout_prob,
            local_attention=cfg.local_attention,
            global_attn_every_n_layers=cfg.global_attn_every_n_layers,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": cfg.global_rope_theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": cfg.local_rope_theta},
            },
            pad_token_id=tokenizer.pad_token_id,
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
            sparse_prediction=False,  # mlmkit's objective chooses the rows; the export predicts all
            classifier_pooling="mean",  # as the published ModernBERT configs
        )

    @staticmethod
    def sequence_classifier(config, pooling: str):
        """``ModernBertForSequenceClassification``, pooling as its config says (cls | mean)."""
        config.classifier_pooling = pooling
        return transformers_class(ModernBert.sequence_classification)(config)

    @staticmethod
    def token_classifier(config):
        """``ModernBertForTokenClassification``: a label per token state."""
        return transformers_class(ModernBert.token_classification)(config)

    @staticmethod
    def question_answerer(config):
        """``ModernBertForQuestionAnswering``: start and end logits per token state."""
        config.num_labels = 2
        return transformers_class(ModernBert.question_answering)(config)

    @staticmethod
    def encoder(model) -> nn.Module:
        return model.model

    @staticmethod
    def layers(model) -> nn.ModuleList:
        return model.model.layers

    @staticmethod
    def head(model, hidden):
        return model.decoder(model.head(hidden))

    @staticmethod
    def output_bias(model):
        return model.decoder.bias

    @staticmethod
    def embeddings(model) -> nn.Module:
        return model.model.embeddings

    @staticmethod
    def set_dropout(model, hidden: float, attention: float) -> None:
        model.config.embedding_dropout = model.config.mlp_dropout = hidden
        model.config.attention_dropout = attention
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = hidden
        for layer in model.model.layers:
            layer.attn.attention_dropout = attention


ARCHITECTURES: dict[str, Any] = {"bert": Bert, "modernbert": ModernBert}


def architecture(name: str):
    """Return the parts of the architecture ``name`` (a ``model.architecture`` or a config's
    ``model_type``)."""
    if name not in ARCHITECTURES:
        raise ConfigError(
            f"{name!r} models are not trained by mlmkit; it trains "
            f"{' and '.join(ARCHITECTURES)} models."
        )
    return ARCHITECTURES[name]


def parts_of(model):
    """Return the parts of ``model`` (a masked-LM or classification model of transformers)."""
    return architecture(model.config.model_type)


def transformers_class(name: str):
    """Look up a class of transformers by name (``Bert.masked_lm``, ...)."""
    import transformers

    return getattr(transformers, name)


def fit_tokenizer(tokenizer, model) -> None:
    """Leave ``token_type_ids`` out of the tokenizer's outputs for a model that takes none
    (ModernBERT), so a pipeline, the fine-tuning batches and a saved tokenizer (its
    tokenizer_config.json names the inputs) never pass them."""
    if not parts_of(model).takes_token_type_ids:
        names = [n for n in tokenizer.model_input_names if n != "token_type_ids"]
        tokenizer.model_input_names = names
        tokenizer.init_kwargs["model_input_names"] = list(names)


def set_rope_theta(model, global_theta: float, local_theta: float) -> bool:
    """Give a ModernBERT the rotary bases of its global and local (sliding-window) layers, in its
    config (so an export carries them) and in its rotary embeddings' frequencies (a context
    extension raises the global base: Warner et al. (2024), 10k -> 160k). Returns whether
    anything changed; a BERT (learned positions) is left as it is."""
    config = model.config
    if getattr(config, "model_type", None) != "modernbert":
        return False
    wanted = {"full_attention": float(global_theta), "sliding_attention": float(local_theta)}
    params = config.rope_parameters
    changed = [
        kind
        for kind, theta in wanted.items()
        if kind in params and float(params[kind]["rope_theta"]) != theta
    ]
    for kind in changed:
        params[kind]["rope_theta"] = wanted[kind]
    if not changed:
        return False
    for module in model.modules():
        if type(module).__name__ != "ModernBertRotaryEmbedding":
            continue
        for kind in changed:
            buffer = getattr(module, f"{kind}_inv_freq", None)
            if buffer is None:
                continue
            inv_freq, _ = module.compute_default_rope_parameters(
                config, buffer.device, layer_type=kind
            )
            buffer.copy_(inv_freq.to(buffer.dtype))
            getattr(module, f"{kind}_original_inv_freq").copy_(inv_freq.to(buffer.dtype))
    return True
