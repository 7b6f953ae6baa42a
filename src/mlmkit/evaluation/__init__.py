"""Evaluation of a saved model: ``mlmkit eval`` (``mlm``: the training loop's own MLM
evaluation, ``training.validation``, on the same fixed masks), zero-shot STS-B (``sts``) and
retrieval (``retrieval``), fine-tuning on a labelled task (``finetune``), GLUE under a
protocol (``glue``), linear probes, during pretraining too (``probe``), the contrastive stage
that makes the encoder a sentence embedder (``embed``, its rows ``embed_data``, held-out sets
``embed_sets``), and offline metric modules (``metric_modules``)."""
