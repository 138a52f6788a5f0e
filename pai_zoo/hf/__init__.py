"""The Hugging Face side: transformers config objects and models for a family (:mod:`.models`), and the shared pieces
of the reference models that remote-code families ship (:mod:`.reference`)."""
from .models import build_hf_model, config_class, config_dict, hf_config, hf_config_from_mcore, model_class

__all__ = ["build_hf_model", "config_class", "config_dict", "hf_config", "hf_config_from_mcore", "model_class"]
