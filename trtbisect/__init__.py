"""trtbisect: find the minimal FP32 fallback that makes an FP16 model match FP32."""

__version__ = "0.1.0"
