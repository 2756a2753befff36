"""The search: a minimal FP32 set given a check (minimal.py), its prior, what a plan costs (cost.py, flow.py), the journal that resumes it, and the TensorRT search."""
