"""Frames of grid games: RGB arrays with numpy only, PNG files with pillow (``render`` extra)."""

from __future__ import annotations

import os

import numpy as np

CELL_PIXELS = 16


def grid_to_rgb(codes: np.ndarray, palette: dict[int, tuple[int, int, int]]) -> np.ndarray:
    """Paint an int grid ``[H, W]`` into an image ``[H*16, W*16, 3]`` uint8, one colour per code."""
    height, width = codes.shape
    image = np.zeros((height, width, 3), dtype=np.uint8)
    for code, colour in palette.items():
        image[codes == code] = colour
    image = np.repeat(np.repeat(image, CELL_PIXELS, axis=0), CELL_PIXELS, axis=1)
    image[::CELL_PIXELS, :, :] //= 2  # grid lines
    image[:, ::CELL_PIXELS, :] //= 2
    return image


def require_pillow() -> None:
    try:
        import PIL  # noqa: F401
    except ImportError as exc:  # pragma: no cover - the workspace installs pillow
        raise ImportError(
            "PNG frames (render_save_dir) need pillow: pip install 'rl-envs[render]'"
        ) from exc


def save_png(image: np.ndarray, path: str) -> str:
    """Write an ``[H, W, 3]`` uint8 array as PNG (atomic: temp file then rename)."""
    require_pillow()
    from PIL import Image

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).save(tmp, format="PNG")
    os.replace(tmp, path)
    return path
