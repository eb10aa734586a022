"""Model checkpoints as data: the lock file `model pull` writes beside the weights (``lock``),
and `model pull` / `model verify` on ``huggingface_hub`` (``pull``)."""
