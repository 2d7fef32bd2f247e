"""Installed as `hydra_plugins.speclab_halving_sweeper`: Hydra instantiates sweepers only from
its `hydra_plugins` namespace, so speclab's sweeper is registered here (the logic lives in
speclab.sweeps.halving)."""
