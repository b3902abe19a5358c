"""scaleout-serve: the five Ray Serve deployments here, their parts in one subpackage
per layer (docs/architecture.md)."""
