"""The report: one HTML page (and a page per pair beside it) that shows how the judge did and why.

Public API::

    from kvjudge.report import build_report, write_report

- :func:`build_report` gathers what the page shows from the store, the open judge and its verdicts: the figures
  of :func:`~kvjudge.judge.evaluate.evaluate` and :func:`~kvjudge.judge.ranking.rank` (what ``eval`` and ``rank``
  print), the views and prompts from the judge's own packing, what reduction removed from the runs' logs;
- :func:`write_report` renders it (Jinja2, autoescaped; charts as inline SVG; a Content-Security-Policy that
  loads nothing and runs only the page's own script) and writes the index and the pair pages.
"""

from kvjudge.report.collect import Report, build_report
from kvjudge.report.pages import Written, check_output, write_report

__all__ = ["Report", "Written", "build_report", "check_output", "write_report"]
