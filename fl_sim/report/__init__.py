"""What a person looks at after a run: the summary table, plots, image grids, the HTML report."""

from fl_sim.report.build import build_report, summary_table

__all__ = ["build_report", "summary_table"]
