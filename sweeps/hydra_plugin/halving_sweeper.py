"""Hydra's handle on speclab's successive-halving sweeper (`hydra/sweeper=halving`)."""

from speclab.sweeps.halving import SuccessiveHalving


class SuccessiveHalvingSweeper(SuccessiveHalving):
    """speclab.sweeps.halving.SuccessiveHalving, where Hydra looks for plugins."""
