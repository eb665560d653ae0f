"""The training child of each experiment.

Run by the orchestrator as ``accelerate launch [flags] -m trainer_entry --spec
runs/<id>/spec.json``: it reads the spec, trains with the Hugging Face
Trainer/TRL, measures, and rank 0 writes ``result.json``. This is the only
package that imports torch, transformers, trl and peft.

A package per part of a run: ``settings`` (the spec's arguments parsed and
checked), ``models``, ``data``, ``tasks`` (what a run trains), ``backends`` (what
trains it), ``measure`` (what is measured while it trains), ``run`` (the steps of
a run, in order) and ``results`` (what it leaves). At the top: the two entry
points (``__main__``, the run; ``check``, the check before launch),
``spec_errors`` and ``buildonce``.
"""

from pathlib import Path

#: the files shipped with the child: the default dataset, the architectures of ``config:<name>``
ASSETS = Path(__file__).resolve().parent / "assets"
