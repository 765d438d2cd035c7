"""See the modules of this package; each names the upstream file it mirrors."""
