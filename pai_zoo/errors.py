"""Exceptions raised by pai-zoo. Every message names the thing that is wrong."""


class PaiZooError(Exception):
    """Base class of every error pai-zoo raises on purpose."""


class UnknownModelError(PaiZooError, KeyError):
    """A name is neither a preset, a family, an alias nor a checkpoint folder."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class PluginError(PaiZooError):
    """A plugin is broken, or two plugins conflict."""


class ConfigTranslationError(PaiZooError):
    """A Hugging Face config holds a value that megatron-core cannot express, or the reverse."""


class MappingError(PaiZooError):
    """A weight-mapping table does not cover the tensors it is given, or a tensor has a wrong shape."""


class VocabularyMismatchError(PaiZooError):
    """Token ids reach past a model's vocabulary: the data was made with another tokenizer than the model's."""


class PaiZooWarning(UserWarning):
    """Something works but probably not as the user meant (the CLI prints it as one ``warning:`` line)."""
