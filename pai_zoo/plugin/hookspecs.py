"""The hooks a pai-zoo plugin implements (pluggy).

A plugin is a module (or object) registered under the entry-point group ``pai_zoo``::

    # pyproject.toml of the plugin
    [project.entry-points.pai_zoo]
    myfamily = "pai_zoo_myfamily"

    # pai_zoo_myfamily/__init__.py
    from pai_zoo import hookimpl

    @hookimpl
    def pai_zoo_families():
        return [Family(name="myfamily", ...)]

Implement only the hooks you need. Keep the plugin module's import free of torch and
megatron-core (import them inside functions): ``pai-zoo list`` imports every plugin.
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("pai_zoo")
hookimpl = pluggy.HookimplMarker("pai_zoo")


@hookspec
def pai_zoo_families():
    """Model builders: return the :class:`pai_zoo.families.family.Family` objects this plugin provides.

    Each family carries its name and aliases, the Hugging Face ``architectures`` and
    ``model_type`` values it handles, its size presets (one of them ``tiny``), its config
    translation (:class:`pai_zoo.plugin.config_map.ConfigMap`), its weight table and, where
    megatron-core lacks a module, its own layer spec. Family names and aliases must be
    unique across all installed plugins.
    """


@hookspec(firstresult=True)
def pai_zoo_weight_map(family, config):
    """Weight-mapping tables: return the :class:`pai_zoo.tables.mapping.WeightMap` for ``family``
    (a :class:`~pai_zoo.families.family.Family`) and ``config`` (its
    :class:`~pai_zoo.plugin.config_map.McoreConfig`), or ``None`` to leave it to others.

    The core answers last with the family's own ``weight_map``; implement this hook to
    supply a table for a family another plugin registered (a different checkpoint layout).
    """


@hookspec(firstresult=True)
def pai_zoo_tokenizer(family, path):
    """Tokenizers: return a :class:`pai_zoo.tokenizers.Tokenizer` for the checkpoint folder or
    tokenizer file ``path`` of ``family``, or ``None`` to leave it to others.

    The core answers last: it loads a Hugging Face ``tokenizer.json``, a SentencePiece
    ``.model`` or a tiktoken ``.tiktoken`` rank file found at ``path``, with the special
    tokens named in ``tokenizer_config.json`` / ``special_tokens_map.json``. Implement this
    hook when the family's tokenizer needs more (its own special tokens, a custom file).
    """


@hookspec
def pai_zoo_rl_trainers():
    """RL trainers: return ``{name: trainer_class}``. A trainer class subclasses
    :class:`pai_zoo.rl.RLTrainer`; ``pai-zoo rl list`` shows it and ``pai_zoo.rl.get_trainer(name)``
    returns it. Names must be unique across plugins."""


@hookspec
def pai_zoo_reward_funcs():
    """Reward functions (``pai-zoo rl grpo --reward-funcs NAME[,NAME]``): return ``{name: function}``. A function
    is called on a batch of completions as ``function(prompts, completions, **fields) -> list[float]``, TRL's
    reward-function contract: ``prompts`` and ``completions`` are lists of texts (of token-id lists for a model
    without a tokenizer), one entry per completion, and ``fields`` the prompt records' other fields, each a list
    in the same order. ``pai_zoo.rl.reward_funcs.list_reward_funcs()`` lists them. Names must be unique across
    plugins."""
