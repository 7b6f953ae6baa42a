"""Evaluation: the one MLM evaluation, used by the training loop and ``mlmkit eval``
(``mlm``), GLUE fine-tuning (``finetune``) and offline metric modules (``metric_modules``)."""
