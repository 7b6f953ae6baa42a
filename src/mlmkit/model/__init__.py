"""The model: BERT for masked LM with the head only at the chosen positions (``bert``), CPU
kernels (``kernels``), sequence classification (``classifier``), loading run dirs and
checkpoints (``loading``)."""
