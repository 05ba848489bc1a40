"""comm: see docs/design.md ("Layout by role"). Empty on purpose: Hydra's plugin scanner imports it."""
