"""What touches the host: forking into a run's custody, proof of identity, signals (one
module sends them all), cgroups, /proc, the marked caches, the descriptor reserve, py-spy,
and the recovery of what a dead daemon left."""
