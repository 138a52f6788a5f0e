"""``pai-zoo eval``: held-out loss and perplexity, and lm-evaluation-harness tasks, on any checkpoint pai-zoo loads.

- :mod:`.sequences` -- the token sequences of a dataset: Megatron's sample packing (megatron-core's ``GPTDataset``,
  as training reads them) or one document per sequence; a JSON Lines file is tokenized on the fly first;
- :mod:`.heldout` -- loss, perplexity and token counts per dataset and for the blend, in one process or under
  torchrun (TP/PP/DP), on either backend;
- :mod:`.harness` -- :class:`~pai_zoo.evaluation.harness.PaiZooLM`, lm-eval's ``LM`` on a pai-zoo model, and
  :func:`~pai_zoo.evaluation.harness.run_tasks`, which runs lm-eval's own ``simple_evaluate`` with it;
- :mod:`.report` -- the terminal tables and the ``--output`` JSON.

Importing this package imports neither torch, megatron-core nor lm-eval.
"""
