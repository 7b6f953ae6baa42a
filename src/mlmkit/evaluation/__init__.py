"""Evaluation: ``mlmkit eval``, the training loop's own MLM evaluation of a saved model
(``mlm``), GLUE fine-tuning (``finetune``) and offline metric modules (``metric_modules``)."""
