"""The frozen-target adapter and every draft architecture, one file per family."""
