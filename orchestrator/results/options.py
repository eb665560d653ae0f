"""What a report is written with: the options of ``tunematrix report`` and of a run's report.

Light on purpose (no pandas): the command line and the API build it before anything
is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.results.aggregate import CostSettings
    from orchestrator.results.report import Report


@dataclass(frozen=True)
class ReportOptions:
    """What a report is written with: the prices, a token budget, the device's memory
    where the source does not say it, the plots, the loss tolerance and the ranking."""

    usd_per_gpu_hour: float | None = None
    #: a token budget: the report estimates the time and cost to train it
    tokens: float | None = None
    #: the price of a kWh and grams of CO2 per kWh: the energy's cost and emissions
    usd_per_kwh: float | None = None
    grams_co2_per_kwh: float | None = None
    #: one device's memory, where the source does not say it (a predecessor's table)
    gpu_memory_gib: float | None = None
    plots: bool = True
    #: the loss gap past which a variant differs from its baseline (default:
    #: ``equivalence.DEFAULT_TOLERANCE``)
    loss_tolerance: float | None = None
    #: what the recommendation ranks cells by (``recommend.RANK_BY``)
    rank_by: str = "speed"

    @property
    def cost(self) -> CostSettings:
        """The prices and the token budget."""
        from orchestrator.results.aggregate import CostSettings

        return CostSettings(
            usd_per_gpu_hour=self.usd_per_gpu_hour,
            tokens=self.tokens,
            usd_per_kwh=self.usd_per_kwh,
            grams_co2_per_kwh=self.grams_co2_per_kwh,
        )

    def write(self, source: Path, output: Path, rows: list[dict[str, Any]] | None = None) -> Report:
        """``orchestrator.results.report.write_report`` with these options."""
        from orchestrator.results import equivalence
        from orchestrator.results.report import GIB, write_report

        return write_report(
            source,
            output,
            self.cost,
            plots=self.plots,
            gpu_memory_bytes=self.gpu_memory_gib * GIB if self.gpu_memory_gib else None,
            rows=rows,
            loss_tolerance=(
                equivalence.DEFAULT_TOLERANCE
                if self.loss_tolerance is None
                else self.loss_tolerance
            ),
            rank_by=self.rank_by,
        )
