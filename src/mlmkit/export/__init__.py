"""Export: ``final/`` as a plain Hugging Face model dir with its model card (``final``)."""
