"""Export: ``final/`` as a plain Hugging Face model dir with its model card (``final``) and the
sentence-transformers files that make it a sentence embedder (``embedder``); ``mlmkit embed``'s
run, whose ``final/`` is a sentence-transformers folder, is ``mlmkit.embed.run``."""
