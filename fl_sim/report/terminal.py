"""What ``fl-sim run``, ``audit`` and ``report`` and an audited Flower app print at the end: the
audit's summary table and the tables of whatever else the run holds."""

from __future__ import annotations

from pathlib import Path


def print_summary(run_dir: Path) -> None:
    """The run's tables, as the report has them, on stdout."""
    from fl_sim.report import summary_table
    from fl_sim.report.build import cohort_table, forecast_tables, inversion_table
    from fl_sim.report.coverage import client_coverage, coverage_note, coverage_table
    from fl_sim.report.faults import left_out_table
    from fl_sim.rundir import AUDIT, CLIENTS, REPORT, ROUNDS, read_jsonl

    records = read_jsonl(run_dir / AUDIT)
    missing = coverage_note(run_dir)
    if missing:
        print(f"\n{missing}")
    if records:
        print("\nLeakage audit (SPEAR++ on every client update; exact = PSNR >= 100 dB):")
        print(summary_table(records))
    coverage = coverage_table(client_coverage(run_dir))
    if coverage:
        print("\nWhat the audit does not hold (the tables cover only the audited replies):")
        print(coverage)
    cohorts = cohort_table(records)
    if cohorts:
        print(
            "\nSecure aggregation (SecAgg+): SPEAR++ on each round's sum, the server's only view "
            "(per-client rows above: what of each client's batch came back through the sum):"
        )
        print(cohorts)
    epsilons = [r for r in read_jsonl(run_dir / ROUNDS) if r.get("epsilon") is not None]
    if epsilons:
        print(
            "\nCentral DP: Flower's noise reaches only the aggregate; epsilon after round "
            f"{epsilons[-1]['round']}: {epsilons[-1]['epsilon']:.3g} (Opacus RDP, every client "
            "every round)"
        )
    faults = left_out_table(read_jsonl(run_dir / CLIENTS))
    if faults:
        print("\nLeft out of aggregation (the federation went on without them):")
        print(faults)
    inversion = inversion_table(records)
    if inversion:
        print("\nOptimisation attack (gradient matching):")
        print(inversion)
    correlations, exposure, _ = forecast_tables(run_dir)
    if correlations:
        print("\nForecast: Spearman's rho of each proxy with the optimisation attack's MSE:")
        print(correlations)
    if exposure:
        print("\nClients ranked by each proxy (1 = most exposed) beside SPEAR++'s recovery:")
        print(exposure)
    print(f"\nrun directory: {run_dir}  (report: {run_dir / REPORT})")
