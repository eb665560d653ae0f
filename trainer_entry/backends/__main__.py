"""``python -m trainer_entry.backends``: save the trainer argument names the parent checks.

The orchestrator checks a scenario's argument names while planning, without
importing transformers; it reads them from ``FIELDS_FILE``. Run this after
upgrading transformers (a test says when the saved list is out of date).
"""

import json

import transformers

from orchestrator.contract.argnames import FIELDS_FILE
from trainer_entry.backends.hf import installed_fields

if __name__ == "__main__":
    names = sorted(installed_fields())
    record = {"transformers": transformers.__version__, "fields": names}
    FIELDS_FILE.write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"wrote {len(names)} TrainingArguments fields of {transformers.__version__} to {FIELDS_FILE}"
    )
