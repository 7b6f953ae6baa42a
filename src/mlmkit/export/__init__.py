"""Export: ``final/`` as a plain Hugging Face model dir with its model card (``final``), and
the pretraining run that ends in it (``run``)."""
