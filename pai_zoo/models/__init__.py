"""L6, models: ``pai_zoo.load`` and its handle (:mod:`.handle`), a Megatron checkpoint read through its family's
table (:mod:`.megatron_checkpoint`), state dicts moved through a table (:mod:`.state_dicts`), ``inspect``, and the
rule by which two models' logits agree (:mod:`.verification`)."""
