"""The training child of each experiment.

Run by the orchestrator as ``accelerate launch [flags] -m trainer_entry --spec
runs/<id>/spec.json``: it reads the spec, trains with the Hugging Face
Trainer/TRL, measures, and rank 0 writes ``result.json``. This is the only
package that imports torch, transformers, trl and peft.
"""

from pathlib import Path

#: the files shipped with the child: the default dataset, the architectures of ``config:<name>``
ASSETS = Path(__file__).resolve().parent / "assets"
