"""``python -m trainer_entry.backends``: save the trainer argument names the parent checks.

The orchestrator checks a scenario's argument names while planning, without
importing transformers or trl; it reads them from ``FIELDS_FILE``
(``TrainingArguments``, the ``hf`` backend's) and ``SFT_FIELDS_FILE``
(``SFTConfig``'s own, which the ``sft`` backend takes besides). Run this after
upgrading transformers or trl (a test says when a saved list is out of date).
"""

import json
from importlib.metadata import version

import transformers

from orchestrator.contract.applicability import FIELDS_FILE, SFT_FIELDS_FILE
from trainer_entry.backends.hf import installed_fields

if __name__ == "__main__":
    names = sorted(installed_fields())
    record = {"transformers": transformers.__version__, "fields": names}
    FIELDS_FILE.write_text(json.dumps(record, indent=1) + "\n")
    print(
        f"wrote {len(names)} TrainingArguments fields of {transformers.__version__} to {FIELDS_FILE}"
    )
    try:
        from trainer_entry.backends.sft import own_fields
    except ImportError:
        print(f"trl is not installed: {SFT_FIELDS_FILE} left as it is")
    else:
        sft = sorted(own_fields())
        trl = version("trl")
        SFT_FIELDS_FILE.write_text(json.dumps({"trl": trl, "fields": sft}, indent=1) + "\n")
        print(f"wrote {len(sft)} SFTConfig fields of trl {trl} to {SFT_FIELDS_FILE}")
