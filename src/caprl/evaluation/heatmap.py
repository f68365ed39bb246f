"""An attention map as a heat map over its image: one shape for the Stack-Cap figure
(:mod:`caprl.figures.attention`) and the caption page (:mod:`caprl.evaluation.caption_page`)."""

from __future__ import annotations

import numpy as np
from PIL import Image
from scipy.ndimage import gaussian_filter

SIGMA_CELLS = 0.5  # Gaussian smoothing, in grid cells
ALPHA = 0.55  # opacity of the attention map over the image
CMAP = "jet"


def attention_map(alpha: np.ndarray, grid: int, height: int, width: int, sigma_cells: float = SIGMA_CELLS) -> np.ndarray:
    """``[grid*grid]`` weights (row-major regions) -> ``[height, width]`` map in [0, 1], peak = 1."""
    cells = np.asarray(alpha, dtype=np.float32).reshape(grid, grid)
    up = np.asarray(Image.fromarray(cells).resize((width, height), Image.Resampling.NEAREST))
    smooth = gaussian_filter(up, sigma=(sigma_cells * height / grid, sigma_cells * width / grid))
    peak = float(smooth.max())
    return smooth / peak if peak > 0 else smooth
