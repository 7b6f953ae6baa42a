"""Hydra config groups (YAML), shipped inside the package as ``mlmkit.conf``."""
