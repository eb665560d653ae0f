"""``python -m trainer_entry.backends``: save the trainer argument names the parent checks.

The orchestrator checks a scenario's argument names while planning, without
importing transformers or trl; it reads them from ``FIELDS_FILE``
(``TrainingArguments``, the ``hf`` backend's) and from each backend's
``own_fields_file`` (``orchestrator.contract.trainers``; ``SFTConfig``'s own,
which the ``sft`` backend takes besides). Run this after upgrading transformers
or trl (a test says when a saved list is out of date).
"""

import json
from importlib.metadata import version

import transformers

from orchestrator.contract.applicability import FIELDS_FILE
from orchestrator.contract.trainers import TRAINERS
from trainer_entry.backends import get_backend
from trainer_entry.backends.hf import installed_fields

if __name__ == "__main__":
    names = sorted(installed_fields())
    record = {"transformers": transformers.__version__, "fields": names}
    FIELDS_FILE.write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"wrote {len(names)} TrainingArguments fields of {transformers.__version__} to {FIELDS_FILE}"
    )
    for declared in TRAINERS:
        saved, package = declared.own_fields_file, declared.needs or "transformers"
        if saved is None:
            continue
        try:
            backend = get_backend(declared.name)
        except ImportError:
            print(f"{package} is not installed: {saved} left as it is")
            continue
        own = sorted(backend.own_fields())
        saved.write_text(json.dumps({package: version(package), "fields": own}, indent=1) + "\n")
        print(
            f"wrote {len(own)} {declared.config_class} fields of {package} "
            f"{version(package)} to {saved}"
        )
