"""Where sandboxes run: one module per backend (local.py: bubblewrap on this machine)."""
