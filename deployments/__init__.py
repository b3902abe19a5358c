"""scaleout-serve deployments: one module per Ray Serve deployment, plus shared models."""
