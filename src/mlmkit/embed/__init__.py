"""``mlmkit embed``: the encoder made a sentence embedder by a contrastive stage on
sentence-transformers' trainer. ``stage`` (the model, losses, evaluators and the trainer's
callbacks), ``data`` (the training rows from pairs files, the Hub or raw text, and the held-out
texts they must not share; labelled files read by ``mlmkit.finetune.reader``), ``sets``
(retrieval sets and pairs built from data at hand: ``python -m mlmkit.embed.sets``), ``run``
(the run: the stage, then ``final/`` with its model card and ``results.json``)."""
