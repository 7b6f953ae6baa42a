"""The model: BERT for masked LM with the head only at the chosen positions, loaded from a
model dir or a checkpoint's weights (``bert``), CPU kernels (``kernels``), sequence
classification (``classifier``)."""
