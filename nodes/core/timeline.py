"""The timeline picture: sigma per step, the boundary, and which expert ran each step."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .report import RunRecord
from .schedule import RunSchedule

COLOURS = {"lead": (214, 92, 170), "high": (232, 139, 44), "low": (66, 135, 245)}
BACKGROUND, AXIS, TEXT, BOUNDARY = (24, 24, 28), (90, 90, 100), (225, 225, 230), (230, 80, 80)


def render_timeline(schedule: RunSchedule, record: RunRecord, width: int = 768, height: int = 300) -> np.ndarray:
    """An RGB uint8 image [H, W, 3] a person reads at a glance."""
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    left, right, top, plot_bottom = 48, width - 16, 40, height - 70
    n = max(len(record.steps), 1)
    step_w = (right - left) / n

    def x_of(i: float) -> float:
        return left + (i + 0.5) * step_w

    def y_of(sigma: float) -> float:
        return plot_bottom - sigma * (plot_bottom - top)

    counts = schedule.stage_steps()
    ratio = "pinned" if schedule.boundary.ratio is None else f"{schedule.boundary.ratio:g}"
    draw.text((left, 8), f"{schedule.sampler}/{schedule.scheduler}, {schedule.steps} steps, shift "
                         f"{schedule.flow_shift:g}, boundary {ratio} ({schedule.boundary.source}): "
                         f"{schedule.split_words()}", fill=TEXT, font=font)
    draw.line([(left, top), (left, plot_bottom), (right, plot_bottom)], fill=AXIS)
    for s in (0.0, 0.5, 1.0):
        draw.text((8, y_of(s) - 6), f"{s:.1f}", fill=TEXT, font=font)
    draw.text((8, top - 16), "sigma", fill=TEXT, font=font)
    if schedule.boundary.ratio is not None:
        y = y_of(schedule.boundary.ratio)
        for x in range(left, right, 8):
            draw.line([(x, y), (min(x + 4, right), y)], fill=BOUNDARY)
        draw.text((right - 110, y - 14), f"boundary {schedule.boundary.ratio:g}", fill=BOUNDARY, font=font)
    points = [(x_of(s.index), y_of(s.sigma)) for s in record.steps]
    if len(points) > 1:
        draw.line(points, fill=TEXT, width=2)
    for step, (x, y) in zip(record.steps, points):
        r = 3
        draw.ellipse([x - r, y - r, x + r, y + r], fill=COLOURS[step.stage])
    # One cell per step: which expert ran it; a cached step is drawn pale with a dark centre line.
    band_top = plot_bottom + 12
    for step, cached in zip(record.steps, record.cached_flags()):
        x0, x1 = left + step.index * step_w + 1, left + step.index * step_w + max(step_w - 1, 1)
        colour = COLOURS[step.stage]
        if cached:
            colour = tuple((c + 255) // 2 for c in colour)
        draw.rectangle([x0, band_top, x1, band_top + 18], fill=colour)
        if cached:
            draw.line([(x0, band_top + 9), (x1, band_top + 9)], fill=BACKGROUND, width=3)
    draw.text((left, band_top + 26), "stage per step:", fill=TEXT, font=font)
    x = left + 110
    legend = [("lead", f"lead ({counts.get('lead', 0)})")] if schedule.lead is not None else []
    legend += [("high", f"high noise ({counts.get('high', 0)})"), ("low", f"low noise ({counts.get('low', 0)})")]
    for stage, words in legend:
        draw.rectangle([x, band_top + 27, x + 12, band_top + 37], fill=COLOURS[stage])
        draw.text((x + 18, band_top + 26), words, fill=TEXT, font=font)
        x += 130
    cached_count = sum(record.cached_flags())
    if record.cache and any("cached_steps" in s for s in record.cache.values()):
        draw.line([(x, band_top + 32), (x + 12, band_top + 32)], fill=TEXT, width=3)
        draw.text((x + 18, band_top + 26), f"cached ({cached_count} of {len(record.steps)} steps)",
                  fill=TEXT, font=font)
    return np.array(image, dtype=np.uint8)
