"""reports/: see docs/architecture.md."""
