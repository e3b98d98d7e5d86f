"""Control-plane fixtures (filled in by the control-plane work, issue 3)."""
