"""Training: optimizer, losses, the jitted step and the loop around it (the mesh and its sharding
rules: t5lite.mesh)."""
