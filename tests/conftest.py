"""Suite-wide settings. wandb is offline by default for users (configs/config.yaml
`wandb.mode`, which follows $WANDB_MODE); in tests its background service would add
seconds to every training run, so it is disabled unless a test turns it back on
(tests/sweeps/test_wandb.py checks the offline files)."""

import os

os.environ.setdefault("WANDB_MODE", "disabled")
