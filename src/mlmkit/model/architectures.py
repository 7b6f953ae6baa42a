"""The encoder families mlmkit trains and continues, and where each keeps its parts.

The training objective, the loaders, the fine-tuning, the embedder and the export reach the
encoder, the MLM head and the output bias through ``parts_of(model)``, so they need no branch per
family. A family is one ``Family`` (below): transformers' classes for its ``model_type`` (looked
up in transformers' own Auto mappings), where its encoder, layers, head and output bias live, and
what it supports. New models are built from presets for ``bert`` and ``modernbert``; every family
is continued from a released model dir (``model.init_from``):

- ``bert``: ``BertForMaskedLM`` (Devlin et al., 2019): learned positions, post-normalisation,
  a GELU FFN, token type embeddings. Encoder ``.bert``, head ``.cls``.
- ``modernbert``: ``ModernBertForMaskedLM`` (Warner et al., 2024, 'Smarter, Better, Faster,
  Longer'): rotary positions, pre-normalisation, a GeGLU FFN, no biases (but the decoder's),
  local attention (a sliding window) in all layers but every ``global_attn_every_n_layers``-th,
  no token types. Encoder ``.model``, head ``.head`` then ``.decoder`` (tied to the embeddings).
- ``roberta``, ``xlm-roberta``, ``camembert`` (Liu et al., 2019; Conneau et al., 2020; Martin et
  al., 2020): BERT's layers, no token types in use (one type), and positions counted from
  ``padding_idx + 1`` (514 rows for 512 tokens). Encoder ``.roberta``, head ``.lm_head``.
- ``deberta-v2`` (DeBERTa-v2 and v3; He et al., 2021): disentangled relative attention, which
  transformers runs in eager attention only (no SDPA), and which takes only a padding mask (no
  ``data.packing=documents``). Encoder ``.deberta``, head ``.cls`` (or
  ``.lm_predictions`` where its config is not ``legacy``).
- ``distilbert`` (Sanh et al., 2019): six BERT layers, no token types. Encoder ``.distilbert``,
  head ``vocab_transform``/``vocab_layer_norm``/``vocab_projector``.
- ``albert`` (Lan et al., 2020): factorised embeddings (``embedding_size``) and one set of layer
  weights shared by every layer. Encoder ``.albert``, head ``.predictions``.
- ``electra`` (Clark et al., 2020): BERT's layers with a projection from narrower embeddings.
  ``ElectraForMaskedLM`` is the generator's class; a discriminator (``ElectraForPreTraining``)
  loads into it with a new MLM head, or is continued with ``objective=rtd``, its discriminator
  head kept. Encoder ``.electra``, head ``.generator_predictions`` then ``.generator_lm_head``.
"""

from __future__ import annotations

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


class Family:
    """The parts of one encoder family, for one ``model_type`` (``architecture(model_type)``).

    transformers' classes come from its Auto mappings, so ``xlm-roberta`` gets
    ``XLMRobertaForMaskedLM`` from the ``roberta`` family's parts. A family overrides what
    differs: where its encoder and head are, its positions, what attention it runs."""

    name = "family"  # the family (several model types may share one)
    prefix = ""  # the encoder's attribute on the masked-LM model (transformers' base_model_prefix)
    takes_token_type_ids = True  # a second token type is trained (BERT's sentence pairs)
    sdpa = True  # transformers runs it on torch SDPA
    sdpa_reason = ""  # why not, where it does not: the log says it
    # documents of a packed block isolated (data.packing=documents) by positions restarting at
    # each document and a block-diagonal mask; None: the family cannot take such a mask
    isolation: str | None = "positions"
    padding_mask_2d = False  # padded batches keep the 2-D mask (the model builds its own)
    position_offset = 0  # added to positions that restart at 0 (RoBERTa's padding_idx + 1)
    tied_keys: tuple[str, ...] = ()  # stored once: the output layer's weight (and bias)
    layer_class = ""  # the encoder layer's class, one FSDP unit each (default <Family>Layer)
    mean_pooling = False  # finetune pooling=mean has a class of this family (BERT's)
    shared_with_classifier: tuple[str, ...] = ()  # default: the encoder

    def __init__(self, model_type: str) -> None:
        from transformers.models.auto import modeling_auto as auto

        self.model_type = model_type
        self.masked_lm = auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES[model_type]
        self.sequence_classification = auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES[
            model_type
        ]
        self.token_classification = auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES[model_type]
        self.question_answering = auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES[model_type]
        self.layer_class = self.layer_class or self.masked_lm.removesuffix("ForMaskedLM") + "Layer"
        # the modules a sequence classifier (a token classifier, a span extractor) takes from
        # the masked-LM model: the encoder, under the same name in both
        self.shared_with_classifier = self.shared_with_classifier or (self.prefix,)

    def positions(self, config) -> int:
        """Return how many tokens a sequence of this model may hold (its position rows less the
        offset they start at)."""
        return config.max_position_embeddings - self.position_offset_of(config)

    def position_offset_of(self, config) -> int:
        """Return what positions that restart at 0 are shifted by (RoBERTa: ``padding_idx + 1``)."""
        return self.position_offset

    def encoder(self, model) -> nn.Module:
        return getattr(model, self.prefix)

    def layers(self, model) -> nn.ModuleList:
        return self.encoder(model).encoder.layer

    def embeddings(self, model) -> nn.Module:
        return self.encoder(model).embeddings

    def head(self, model, hidden):
        raise NotImplementedError

    def output_bias(self, model):
        raise NotImplementedError

    def sequence_classifier(self, config, pooling: str):
        """Return the family's own ``...ForSequenceClassification``, with its head (pooling=mean
        is BERT's and ModernBERT's; ``mlmkit finetune`` says so in its log)."""
        return transformers_class(self.sequence_classification)(config)

    def token_classifier(self, config):
        """``...ForTokenClassification``: a label per token state."""
        return transformers_class(self.token_classification)(config)

    def question_answerer(self, config):
        """``...ForQuestionAnswering``: start and end logits per token state."""
        config.num_labels = 2
        return transformers_class(self.question_answering)(config)

    def set_dropout(self, model, hidden: float, attention: float) -> None:
        """Set every dropout of the model to ``hidden`` and its attention's to ``attention``, in
        the modules and in the config (which an export carries)."""
        keys = DROPOUT_CONFIG_KEYS.get(self.name, DROPOUT_CONFIG_KEYS["bert"])
        setattr(model.config, keys[0], hidden)
        setattr(model.config, keys[1], attention)
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = hidden
        for module in model.modules():
            if "Attention" in type(module).__name__:
                for name in ("dropout", "attention_dropout"):
                    child = getattr(module, name, None)
                    if isinstance(child, nn.Dropout):
                        child.p = attention

    def init_positions(self, model, how: str) -> None:
        """Leave the positions as they are (a preset's start is BERT's alone)."""

    def init_attention(self, model, how: str) -> None:
        """Leave the attention as it is (a preset's start is BERT's alone)."""

    def check_objective(self, objective: str) -> str | None:
        """Return why ``objective`` cannot train this family, or None."""
        if objective == "rtd":
            return (
                f"objective=rtd shares a BERT-style embeddings module with its generator and a "
                f"{self.model_type} model has its own; continue a bert or electra model with "
                "objective=rtd, or use objective=mlm"
            )
        return None


# The config keys of a family's hidden and attention dropout
DROPOUT_CONFIG_KEYS = {
    "bert": ("hidden_dropout_prob", "attention_probs_dropout_prob"),
    "distilbert": ("dropout", "attention_dropout"),
    "modernbert": ("mlp_dropout", "attention_dropout"),
}


class Bert(Family):
    name = "bert"
    prefix = "bert"
    mean_pooling = True
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
    def check_objective(objective: str) -> str | None:
        """Every objective trains a BERT."""
        return None

    @staticmethod
    def set_dropout(model, hidden: float, attention: float) -> None:
        model.config.hidden_dropout_prob = hidden
        model.config.attention_probs_dropout_prob = attention
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = hidden
        for layer in model.bert.encoder.layer:
            layer.attention.self.dropout.p = attention


class ModernBert(Family):
    name = "modernbert"
    prefix = "model"
    mean_pooling = True  # its own classifier pools as its config says
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


class Roberta(Family):
    """RoBERTa, XLM-RoBERTa and CamemBERT: BERT's layers, positions from ``padding_idx + 1``."""

    name = "roberta"
    prefix = "roberta"
    takes_token_type_ids = False  # one token type (type_vocab_size 1)
    tied_keys = ("lm_head.decoder.weight", "lm_head.decoder.bias")

    def position_offset_of(self, config) -> int:
        return config.pad_token_id + 1

    def head(self, model, hidden):
        return model.lm_head(hidden)

    def output_bias(self, model):
        return model.lm_head.bias


class DebertaV2(Family):
    """DeBERTa-v2 and v3: relative (disentangled) attention, eager only in transformers."""

    name = "deberta-v2"
    prefix = "deberta"
    takes_token_type_ids = False  # v3's type_vocab_size is 0
    sdpa = False
    sdpa_reason = (
        "DeBERTa's disentangled attention (content-to-position and position-to-content terms) "
        "has no SDPA kernel in transformers: it runs in eager attention"
    )
    # transformers' DeBERTa multiplies its embeddings by the attention mask, which must be the
    # 2-D padding mask: no block-diagonal mask reaches its attention
    isolation = None
    padding_mask_2d = True
    tied_keys = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")

    def head(self, model, hidden):
        if model.config.legacy:
            return model.cls(hidden)
        return model.lm_predictions(hidden, self.embeddings(model).word_embeddings)

    def output_bias(self, model):
        if model.config.legacy:
            return model.cls.predictions.bias
        return model.lm_predictions.lm_head.bias


class DistilBert(Family):
    """DistilBERT: six BERT layers, no token types."""

    name = "distilbert"
    prefix = "distilbert"
    takes_token_type_ids = False
    layer_class = "TransformerBlock"
    tied_keys = ("vocab_projector.weight",)

    def layers(self, model) -> nn.ModuleList:
        return model.distilbert.transformer.layer

    def head(self, model, hidden):
        hidden = model.vocab_layer_norm(model.activation(model.vocab_transform(hidden)))
        return model.vocab_projector(hidden)

    def output_bias(self, model):
        return model.vocab_projector.bias


class Albert(Family):
    """ALBERT: factorised embeddings, one set of layer weights shared by all layers (in groups)."""

    name = "albert"
    prefix = "albert"
    tied_keys = ("predictions.decoder.weight", "predictions.decoder.bias")

    def layers(self, model) -> nn.ModuleList:
        """Return the distinct layers (a shared layer once): ``num_hidden_groups`` groups of
        ``inner_group_num`` layers, each applied to several of the model's layers."""
        groups = model.albert.encoder.albert_layer_groups
        return nn.ModuleList([layer for group in groups for layer in group.albert_layers])

    def head(self, model, hidden):
        return model.predictions(hidden)

    def output_bias(self, model):
        return model.predictions.bias


class Electra(Family):
    """ELECTRA: BERT's layers behind a projection from narrower embeddings. A discriminator
    continues with objective=rtd (its head kept); any ELECTRA continues with objective=mlm."""

    name = "electra"
    prefix = "electra"
    tied_keys = ("generator_lm_head.weight",)

    def head(self, model, hidden):
        return model.generator_lm_head(model.generator_predictions(hidden))

    def output_bias(self, model):
        return model.generator_lm_head.bias

    def check_objective(self, objective: str) -> str | None:
        return None


FAMILIES = (Bert, ModernBert, Roberta, DebertaV2, DistilBert, Albert, Electra)
# every model_type mlmkit continues, and its family
MODEL_TYPES = {
    "bert": Bert,
    "modernbert": ModernBert,
    "roberta": Roberta,
    "xlm-roberta": Roberta,
    "camembert": Roberta,
    "deberta-v2": DebertaV2,
    "distilbert": DistilBert,
    "albert": Albert,
    "electra": Electra,
}
ARCHITECTURES: dict[str, Family] = {}  # model_type -> its parts, made on first use
PRESET_ARCHITECTURES = ("bert", "modernbert")  # model.architecture: a new model of a preset


def architecture(name: str) -> Family:
    """Return the parts of the model type ``name`` (a ``model.architecture`` or a config's
    ``model_type``)."""
    if name not in MODEL_TYPES:
        raise ConfigError(
            f"{name!r} models are not trained by mlmkit; it trains and continues "
            f"{', '.join(MODEL_TYPES)} models."
        )
    if name not in ARCHITECTURES:
        ARCHITECTURES[name] = MODEL_TYPES[name](name)
    return ARCHITECTURES[name]


def ffn_size(config) -> int:
    """Return the width of a layer's FFN (DistilBERT's config calls it ``hidden_dim``)."""
    return getattr(config, "intermediate_size", None) or config.hidden_dim


TITLES = {  # how the model card names each model type
    "bert": "BERT",
    "modernbert": "ModernBERT",
    "roberta": "RoBERTa",
    "xlm-roberta": "XLM-RoBERTa",
    "camembert": "CamemBERT",
    "deberta-v2": "DeBERTa-v2/v3",
    "distilbert": "DistilBERT",
    "albert": "ALBERT",
    "electra": "ELECTRA",
}


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
