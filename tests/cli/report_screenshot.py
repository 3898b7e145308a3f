"""Checks a screenshot of `knod-policy audit report --html` against the report's JSON.

Usage: report_screenshot.py PAGE.html REPORT.json SCREENSHOT.png

Each chart on the page draws its bars in one solid colour of its own, named on its <svg> as
data-bar-colour (the only thing read from the page: which colour is which chart). In the
screenshot the pixels of exactly that colour are the chart's bars; they are grouped into bars
(runs of rows for horizontal charts, runs of columns for the timeline), each must be a solid
rectangle, and their lengths must be proportional to the JSON's numbers (within 2 pixels of
value / max * longest bar), in the order the page promises: largest first for per-user,
per-netdev, per-GPU and per-rule charts; in time order, spaced by the hours between them, for
the timeline. Prints one line per chart; exit 1 on any mismatch.
"""
import json
import re
import sys

from PIL import Image, ImageChops

TOLERANCE = 2  # pixels: rounding on the page and in this check

page, report_path, shot = sys.argv[1:4]
html = open(page, encoding="utf-8").read()
report = json.load(open(report_path))
image = Image.open(shot).convert("RGB")

colours = dict(re.findall(r'<svg id="([a-z-]+)" class="chart" data-bar-colour="#([0-9a-f]{6})"', html))
failures = []


def fail(msg):
    failures.append(msg)
    print("not ok -", msg)


if len(set(colours.values())) != len(colours):
    fail(f"two charts share a colour: {colours}")


def expected():
    """chart id -> (orientation, [(position, value)]) with only the values a bar is drawn for."""
    out = {}
    for hour_field, chart in [("grants", "grants"), ("denials", "denials"),
                              ("quota_refusals", "quota-refusals"), ("other_refusals", "other-refusals"),
                              ("revocations", "revocations"), ("rx_bytes", "rx-bytes")]:
        out["timeline-" + chart] = ("v", [(h["start_us"] // 3_600_000_000, h[hour_field])
                                          for h in report["timeline"] if h[hour_field] > 0])
    for view in ["user", "netdev", "gpu"]:
        for field, chart in [("sessions", "sessions"), ("rx_bytes", "rx-bytes"),
                             ("denials", "denials"), ("quota_refusals", "quota-refusals")]:
            values = [t[field] for t in report["by_" + view] if t[field] > 0]
            out[f"{view}-{chart}"] = ("h", list(enumerate(sorted(values, reverse=True))))
    for chart, field, count in [("denied-rules", "top_denied_rules", "denials"),
                                ("quota-rules", "quota_refusals_by_rule", "quota_refusals"),
                                ("refusal-decisions", "refusals_by_decision", "count")]:
        values = [r[count] for r in report[field] if r[count] > 0]
        out[chart] = ("h", list(enumerate(sorted(values, reverse=True))))
    return out


def mask_of(hex_colour):
    """A 1-bit image: where the screenshot has exactly this colour."""
    rgb = tuple(int(hex_colour[i:i + 2], 16) for i in (0, 2, 4))
    bands = [band.point(lambda v, want=want: 255 if v == want else 0) for band, want in zip(image.split(), rgb)]
    return ImageChops.multiply(ImageChops.multiply(bands[0], bands[1]), bands[2])


def bars(mask, orientation):
    """Solid rectangles of the mask as (left, top, right, bottom), along the chart's axis."""
    box = mask.getbbox()
    if box is None:
        return []
    x0, y0, x1, y1 = box
    # Runs of rows (horizontal bars) or columns (vertical bars) that hold any bar pixel.
    first, end = (y0, y1) if orientation == "h" else (x0, x1)
    crop = (lambda i: (x0, i, x1, i + 1)) if orientation == "h" else (lambda i: (i, y0, i + 1, y1))
    runs, start = [], None
    for i in range(first, end + 1):  # one past the box: closes the last run
        on = i < end and mask.crop(crop(i)).getbbox() is not None
        if on and start is None:
            start = i
        if not on and start is not None:
            runs.append((start, i))
            start = None
    out = []
    for a, b in runs:
        part = (x0, a, x1, b) if orientation == "h" else (a, y0, b, y1)
        l, t, r, btm = mask.crop(part).getbbox()
        rect = (part[0] + l, part[1] + t, part[0] + r, part[1] + btm)
        area = (rect[2] - rect[0]) * (rect[3] - rect[1])
        filled = mask.crop(rect).histogram()[255]
        if filled != area:
            fail(f"a bar at {rect} is not a solid rectangle ({filled} of {area} pixels)")
        out.append(rect)
    return out


slot_estimates, positions = [], []
for chart, (orientation, want) in expected().items():
    if chart not in colours:
        if want:
            fail(f"{chart}: not on the page, but the report has {want}")
        else:
            print(f"ok - {chart}: no bars, none expected")
        continue
    found = bars(mask_of(colours[chart]), orientation)
    lengths = [(r[2] - r[0]) if orientation == "h" else (r[3] - r[1]) for r in found]
    if len(found) != len(want):
        fail(f"{chart}: {len(found)} bars drawn, {len(want)} values in the report ({want}; lengths {lengths})")
        continue
    if not found:
        fail(f"{chart}: on the page with nothing to draw")
        continue
    values = [v for _, v in want]
    top = max(values)
    longest = max(lengths)
    bad = [(v, n) for v, n in zip(values, lengths) if abs(n - v / top * longest) > TOLERANCE]
    # A shared baseline: horizontal bars start at one x, vertical ones end at one y.
    base = {r[0] for r in found} if orientation == "h" else {r[3] for r in found}
    if bad or len(base) != 1:
        fail(f"{chart}: lengths {lengths} for values {values} (off: {bad}; baselines {sorted(base)})")
        continue
    if orientation == "v":
        hours = [h for h, _ in want]
        positions.append((chart, hours, [r[0] for r in found]))
        for i in range(1, len(found)):
            slot_estimates.append((found[i][0] - found[0][0]) / (hours[i] - hours[0]))
    print(f"ok - {chart}: {len(found)} bars, lengths {lengths} for values {values}")

# The timeline's bars sit at their hours: one hour is the same width everywhere, gaps included.
if slot_estimates:
    slot = sorted(slot_estimates)[len(slot_estimates) // 2]
    for chart, hours, xs in positions:
        off = [(h, x) for h, x in zip(hours, xs) if abs((x - xs[0]) - (h - hours[0]) * slot) > TOLERANCE]
        if off:
            fail(f"{chart}: bars at x {xs} for hours {hours} (an hour is {slot:.1f} px)")
    if not failures:
        print(f"ok - timeline bars sit at their hours ({slot:.1f} px an hour)")

sys.exit(1 if failures else 0)
