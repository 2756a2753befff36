"""Verified FP16-safe graph rewrites: the driver (driver.py) and the rules it tries (rules.py, one module a family)."""
