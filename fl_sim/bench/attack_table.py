"""``fl-sim bench attack``'s results, per case over its seeds: the shares, times and stages,
and the Markdown table they are read in."""

from __future__ import annotations

from typing import Any

import numpy as np

from fl_sim.bench.converge import TARGET_ACCURACY
from fl_sim.bench.machine import measured_on


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case: sample-level shares over all seeds' samples, batch-level share, mean times."""
    samples = sum(r["samples"] for r in rows)
    stages: dict[str, float] = {}
    for r in rows:
        for k, v in r["attack"]["timings"].items():
            stages[k] = stages.get(k, 0.0) + v / len(rows)
    return {
        "case": rows[0]["case"],
        "seeds": [r["seed"] for r in rows],
        "psnr_mean": float(np.mean([r["psnr_mean"] for r in rows])),
        "psnr_min": float(min(r["psnr_min"] for r in rows)),
        # None for tabular records (SSIM compares neighbouring pixels).
        "ssim_mean": (
            float(np.mean([r["ssim_mean"] for r in rows]))
            if all(r["ssim_mean"] is not None for r in rows)
            else None
        ),
        "share_exact_samples": sum(r["share_exact"] * r["samples"] for r in rows) / samples,
        "share_near_exact_samples": sum(r["share_near_exact"] * r["samples"] for r in rows)
        / samples,
        "share_near_exact_true_scale_samples": sum(
            r["share_near_exact_true_scale"] * r["samples"] for r in rows
        )
        / samples,
        # None without noise (the bias gradient then fixes every scale exactly).
        "near_exact_scale_bound_samples": (
            sum(r["near_exact_scale_bound"] * r["samples"] for r in rows) / samples
            if all(r.get("near_exact_scale_bound") is not None for r in rows)
            else None
        ),
        "share_certified_samples": sum(r["attack"]["certified"] for r in rows) / samples,
        # Certified samples that are not exact (>= 100 dB) or not even near-exact (>= 40 dB).
        "certified_not_exact": sum(r["certified_not_exact"] for r in rows),
        "certified_not_near_exact": sum(r["certified_not_near_exact"] for r in rows),
        "share_exact_batches": float(np.mean([r["batch_exact"] for r in rows])),
        "noise_told": all(r.get("noise_told", True) for r in rows),
        "noise_added": any(r.get("noise_std") for r in rows),
        "noise_std_estimated_mean": (
            float(np.mean(fits))
            if (fits := [f for r in rows if (f := r["attack"].get("noise_std_estimated"))])
            else None
        ),
        # The spectrum's noise fit: its largest relative error (None where nothing was fitted),
        # and the lowest confidence of the batch-size estimate.
        "noise_estimate_error_max": max(
            (abs(e) for r in rows if (e := r.get("noise_estimate_error")) is not None),
            default=None,
        ),
        "batch_size_confidence_min": min(
            float(r["attack"].get("batch_size_confidence", 1.0)) for r in rows
        ),
        "batch_size_correct": float(
            np.mean([r["attack"]["batch_size"] == r["batch_size"] for r in rows])
        ),
        "seconds_mean": float(np.mean([r["seconds"] for r in rows])),
        # The attack's time over one SVD of the same gradient, per seed, averaged.
        "svd_ratio_mean": (
            float(np.mean([r["seconds"] / r["svd_seconds"] for r in rows]))
            if all(r.get("svd_seconds") for r in rows)
            else None
        ),
        "stage_seconds_mean": stages,
        # Converged networks (None otherwise): test and training accuracy, lowest over seeds.
        "network_accuracy_min": (
            {
                split: min(r["converged"][f"{split}_accuracy"] for r in rows)
                for split in ("test", "train")
            }
            if all(r.get("converged") for r in rows)
            else None
        ),
    }


def markdown(summaries: list[dict[str, Any]], paper: dict[str, str], meta: dict[str, Any]) -> str:
    """The results as a Markdown table, with how and where they were measured."""
    lines = [
        f"Measured {meta['finished']} on {measured_on(meta['hardware'])}, data "
        f"`{meta['data']}`, gradient dtype {meta['dtype']}.",
        "",
        f"Command: `{meta['command']}`",
        "",
        "Exact = PSNR >= 100 dB, near-exact = PSNR >= 40 dB, both as shares of all samples over "
        "all seeds; certified: the samples the attack itself vouches for (no ground truth), "
        "in brackets those of them under 100 dB / under 40 dB of their true sample; "
        "at true scale: near-exact once each reconstruction is rescaled to the truth "
        "(a judge's diagnostic of the scales the engine fixed); scale bound: the near-exact "
        "share expected with every column exact and each scale fitted to the first layer's "
        "noisy bias gradient alone (`scale_bound`; - without noise), which one-step updates "
        "beat by using the next layer's too; batches = share of seeds whose whole batch is "
        "exact; B_hat confidence: the lowest over seeds of the attack's confidence in its "
        "batch-size estimate; noise: whether the attacker was told the DP noise level, and how far "
        "its fit to the gradient's spectrum was at worst from the true per-entry std (without DP "
        "noise: the mean std of the round-off bulk it fitted, if any); s mean: seconds per attack "
        "(with `--svd-reference`, in brackets: as a multiple of one full float64 SVD of the same "
        "gradient timed right after it, averaged over seeds).",
        "",
        "| case | seeds | PSNR mean | PSNR min | SSIM | exact | certified | near-exact | "
        "at true scale | scale bound | batches exact | B_hat right | B_hat confidence (min) | "
        "noise | s mean | factorise / search / refine / select+solve s | paper |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        st = s["stage_seconds_mean"]
        stages = (
            " / ".join(f"{st.get(k, 0.0):.1f}" for k in ("factorise", "search", "refine"))
            + f" / {st.get('select', 0.0) + st.get('solve', 0.0):.2f}"
        )
        bound = s["near_exact_scale_bound_samples"]
        bound_text = "-" if bound is None else f"{100 * bound:.1f}%"
        error = s.get("noise_estimate_error_max")
        noise = "told" if s.get("noise_told", True) else "not told"
        svd = s.get("svd_ratio_mean")
        ratio = "" if svd is None else f" ({svd:.2f} SVD)"
        confidence = s.get("batch_size_confidence_min", 1.0)
        ssim = "-" if s["ssim_mean"] is None else f"{s['ssim_mean']:.3f}"
        if error is not None:
            noise += f", fit within {100 * error:.2f}%"
        if not s.get("noise_added", True):
            fitted = s.get("noise_std_estimated_mean")
            noise = "none added" + (f"; round-off bulk fitted, std {fitted:.2g}" if fitted else "")
        lines.append(
            f"| {s['case']} | {len(s['seeds'])} | {s['psnr_mean']:.1f} | {s['psnr_min']:.1f} | "
            f"{ssim} | {100 * s['share_exact_samples']:.1f}% | "
            f"{100 * s['share_certified_samples']:.1f}% "
            f"({s.get('certified_not_exact', '?')} / {s.get('certified_not_near_exact', '?')}) | "
            f"{100 * s['share_near_exact_samples']:.1f}% | "
            f"{100 * s['share_near_exact_true_scale_samples']:.1f}% | {bound_text} | "
            f"{100 * s['share_exact_batches']:.0f}% | "
            f"{100 * s['batch_size_correct']:.0f}% | {confidence:.2f} | {noise} | "
            f"{s['seconds_mean']:.1f}{ratio} | {stages} | "
            f"{paper.get(s['case'], '')} |"
        )
    trained = [s for s in summaries if s.get("network_accuracy_min")]
    if trained:
        lines += [
            "",
            "Networks trained on the whole training split, lowest accuracy over seeds:",
            "",
        ]
    for s in trained:
        acc = s["network_accuracy_min"]
        reached = "reached" if acc["test"] >= TARGET_ACCURACY else "**not reached**"
        lines.append(
            f"- {s['case']}: test {100 * acc['test']:.1f}%, training {100 * acc['train']:.1f}% "
            f"(the target of {100 * TARGET_ACCURACY:.0f}% test accuracy {reached})"
        )
    return "\n".join(lines) + "\n"
