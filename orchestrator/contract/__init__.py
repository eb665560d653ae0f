"""The contract between the parent and the training child, and the results folder's shape.

Imported by both sides; imports nothing else of the project (an import-linter
contract checks it). ``spec`` (what the parent asks), ``result`` (what the child
measured), ``outcome`` (statuses), ``progress`` (the live step file), ``layout``
(every path of a results folder), ``applicability`` (the trainer's argument names, and
which apply to which task, trainer and PEFT method), ``columns`` (every column of the
results tables).
"""
