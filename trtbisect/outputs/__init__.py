"""What trtbisect writes, and how: files under --out that never follow a planted link
(`files`), and model-controlled strings escaped for where they go (`escape`).

(The STYLE's `outputs/` room; outdir.py, plan.py, render.py and report.py move here when
nobody else is editing them.)
"""
