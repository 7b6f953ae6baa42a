"""Evaluation of a saved model: ``mlmkit eval`` (``mlm``: the training loop's own MLM
evaluation, ``training.validation``, on the same fixed masks), zero-shot STS-B (``sts``), GLUE
fine-tuning (``finetune``) and offline metric modules (``metric_modules``)."""
