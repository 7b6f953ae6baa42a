"""Evaluation of a saved model: ``mlmkit eval`` (``mlm``: the training loop's own MLM
evaluation, ``training.validation``, on the same fixed masks), zero-shot STS-B (``sts``) and
retrieval (``retrieval``), GLUE under a protocol (``glue``, its fine-tunings run by
``mlmkit.finetune``), a fine-tuned model's predictions (``predict``), linear probes, during
pretraining too (``probe``), and the minimal pairs (``pairs``). The contrastive stage that
makes the encoder a sentence embedder is ``mlmkit.embed``."""
