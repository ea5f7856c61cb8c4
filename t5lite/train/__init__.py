"""Training: mesh and sharding rules, optimizer, losses, the jitted step and the loop around it."""
