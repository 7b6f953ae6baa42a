"""Export: ``final/`` as a plain Hugging Face model dir with its model card (``final``), the
pretraining run that ends in it (``run``), and ``mlmkit embed``'s run, whose ``final/`` is a
sentence-transformers folder (``embed_run``)."""
