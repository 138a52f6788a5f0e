"""``pai-zoo train``: continued pretraining and SFT on megatron-core (see :mod:`.trainer`)."""
from .config import TrainConfig, TrainConfigError

__all__ = ["TrainConfig", "TrainConfigError", "train"]


def train(cfg: TrainConfig, echo=print) -> dict:
    """Run (or resume) the training run ``cfg`` describes; returns the last step's metrics."""
    from .trainer import train as run

    return run(cfg, echo)
