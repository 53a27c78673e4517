"""The report renderers: markdown (and roofline and bar-chart figures) from measurement records,
never from a live run. render.py draws the exploration report, shapes.py the suites' report,
model.py the model report. What they render is written to reports/, which holds outputs only."""
