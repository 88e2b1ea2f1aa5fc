"""The HTTP side's response (and prediction request) bodies, one module per resource."""
